"""Apache Airflow provider for plgd hub events on NATS JetStream.

The provider registers itself through the ``apache_airflow_provider`` entry point
(:func:`airflow_provider_plgd.get_provider_info.get_provider_info`).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"
DISTRIBUTION_NAME = "airflow-provider-plgd"

#: The public functions for notebooks and other DAGs, imported on first use (the package itself
#: stays light: the Spark executors import it).
_PUBLIC = {
    "decode_message": "airflow_provider_plgd.spark.decode_batch",
    "read_snapshot": "airflow_provider_plgd.tables.snapshot_store",
    "latest_snapshot": "airflow_provider_plgd.tables.snapshot_store",
}

__all__ = ["DISTRIBUTION_NAME", "__version__", "decode_message", "latest_snapshot", "read_snapshot"]


def __getattr__(name: str):
    """``decode_message(subject, payload) -> dict`` (a row of the ``events`` table),
    ``read_snapshot(root, table, version=None, *, as_of=None) -> pyarrow.Table`` and
    ``latest_snapshot(root) -> dict | None`` (the latest snapshot's record), imported on first use."""
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
