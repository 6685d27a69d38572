"""The old import paths of moved modules: a warning, then the module at its new path.

The JetStream client library moved from ``airflow_provider_plgd.hooks`` (and
``airflow_provider_plgd.completeness``) to :mod:`airflow_provider_plgd.jetstream`. Each old path is a
small module that calls :func:`moved_module` and puts the new module in its place in
``sys.modules``, so ``from airflow_provider_plgd.hooks.api import JetStreamApi`` (and
``mock.patch("airflow_provider_plgd.hooks.pull.…")``) reach the one module that the code uses.
"""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType


def deprecation_category() -> type[DeprecationWarning]:
    """Airflow's ``AirflowProviderDeprecationWarning`` when Airflow is importable (a Spark
    executor has no Airflow), else ``DeprecationWarning``."""
    # lazy: a Spark executor has no Airflow
    try:
        from airflow.exceptions import AirflowProviderDeprecationWarning
    except ImportError:
        return DeprecationWarning
    return AirflowProviderDeprecationWarning


def moved_module(old: str, new: str) -> ModuleType:
    """Warn that module ``old`` moved to ``new`` and return the module ``new``.

    :param old: the former dotted module path, e.g. ``airflow_provider_plgd.hooks.api``.
    :param new: the dotted module path it moved to, e.g. ``airflow_provider_plgd.jetstream.api``.
    :raises ImportError: ``new`` cannot be imported.
    """
    warnings.warn(f"module {old} moved to {new}; import it from there (the old path will be removed)",
                  deprecation_category(), stacklevel=3)
    return importlib.import_module(new)
