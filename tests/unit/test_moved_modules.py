"""The old paths of the JetStream library (``hooks.api`` …, ``completeness``) still import, and warn.

Users' code and their ``mock.patch`` strings reach the one module the provider uses
(``airflow_provider_plgd.jetstream.*``), with an ``AirflowProviderDeprecationWarning`` naming the new
path; without Airflow (a Spark executor) the warning is a plain ``DeprecationWarning``.
"""

from __future__ import annotations

import builtins
import importlib
import sys
from unittest import mock

import pytest

from airflow_provider_plgd import _moved
from airflow_provider_plgd.compat import AirflowProviderDeprecationWarning

MOVED = {f"airflow_provider_plgd.hooks.{m}": f"airflow_provider_plgd.jetstream.{m}"
         for m in ("api", "client", "counting", "pull", "durable", "messages", "blocking")}
MOVED["airflow_provider_plgd.completeness"] = "airflow_provider_plgd.jetstream.completeness"


def _fresh_import(name: str):
    sys.modules.pop(name, None)
    parent, _, child = name.rpartition(".")
    if hasattr(sys.modules.get(parent), child):
        delattr(sys.modules[parent], child)
    return importlib.import_module(name)


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_the_old_path_is_the_new_module_and_warns(old, new):
    with pytest.warns(AirflowProviderDeprecationWarning, match=f"{old} moved to {new}"):
        module = _fresh_import(old)
    assert module is importlib.import_module(new)
    assert sys.modules[old] is module


def test_a_patch_on_the_old_path_reaches_the_code():
    from airflow_provider_plgd.jetstream import pull

    with pytest.warns(AirflowProviderDeprecationWarning):
        _fresh_import("airflow_provider_plgd.hooks.pull")
    with mock.patch("airflow_provider_plgd.hooks.pull.PULL_EXPIRES_S", 1234.5):
        assert pull.PULL_EXPIRES_S == 1234.5
    assert pull.PULL_EXPIRES_S != 1234.5


def test_the_old_connection_module_has_every_name():
    from airflow_provider_plgd.hooks import base
    from airflow_provider_plgd.jetstream import connection

    with pytest.warns(AirflowProviderDeprecationWarning, match="hooks.connection moved to"):
        old = _fresh_import("airflow_provider_plgd.hooks.connection")
    assert old.JetStreamSettings is connection.JetStreamSettings
    assert old._normalize_server is connection._normalize_server  # private names too
    assert old.NKEY_SEED_EXTRA == "nkey_seed_secret"
    assert old.mask_settings_secrets is base.mask_settings_secrets


def test_without_airflow_the_warning_is_a_plain_deprecation_warning(monkeypatch):
    real_import = builtins.__import__

    def no_airflow(name, *args, **kwargs):
        if name == "airflow" or name.startswith("airflow."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_airflow)
    assert _moved.deprecation_category() is DeprecationWarning
    monkeypatch.setattr(builtins, "__import__", real_import)
    assert _moved.deprecation_category() is AirflowProviderDeprecationWarning
