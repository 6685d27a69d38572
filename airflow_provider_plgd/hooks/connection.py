"""Deprecated path: moved to :mod:`airflow_provider_plgd.jetstream.connection` (kept for users' imports;
warns). ``mask_settings_secrets`` / ``amask_settings_secrets`` (Airflow's log masker) are now in
:mod:`airflow_provider_plgd.hooks.base`."""

from typing import Any

from airflow_provider_plgd._moved import moved_module
from airflow_provider_plgd.hooks.base import amask_settings_secrets, mask_settings_secrets  # noqa: F401
from airflow_provider_plgd.jetstream.connection import *  # noqa: F403

_moved = moved_module(__name__, "airflow_provider_plgd.jetstream.connection")


def __getattr__(name: str) -> Any:
    """Every other name (private ones too) from :mod:`airflow_provider_plgd.jetstream.connection`."""
    return getattr(_moved, name)
