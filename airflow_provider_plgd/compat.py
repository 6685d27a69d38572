"""The one place that imports Airflow APIs that moved between Airflow 2.11 and 3.x.

On Airflow 3 the public Task SDK (``airflow.sdk``) is used; on Airflow 2.11 the same names
come from their 2.x modules. The provider's modules import these names from here; a few other
moved names are imported, with the same 3.x-then-2.11 fallback, where they are used: Airflow's
exceptions (``exceptions.py``, ``etl/plan.py``, ``operators/spark_submit.py``), ``AssetAlias``,
``Param``, ``AssetWatcher`` and ``mask_secret``; ``etl/dag.py`` imports ``DAG`` and ``task`` inside
``build_etl_dag``.
``Asset`` on Airflow 2.x is a function that returns a ``Dataset`` (2.x datasets have no name).
Source: Airflow 3 migration guide ("Public Interface of Airflow", ``airflow.sdk``).
"""

from __future__ import annotations

try:  # Airflow 3.x
    from airflow.sdk import BaseHook, BaseOperator, BaseSensorOperator, Context, PokeReturnValue

    AIRFLOW_V_3 = True
except ImportError:  # pragma: no cover - Airflow 2.11
    from airflow.hooks.base import BaseHook  # type: ignore[no-redef,attr-defined]
    from airflow.models import BaseOperator  # type: ignore[no-redef]
    from airflow.sensors.base import BaseSensorOperator, PokeReturnValue  # type: ignore[no-redef]
    from airflow.utils.context import Context  # type: ignore[no-redef,attr-defined]

    AIRFLOW_V_3 = False

try:  # Airflow 3.x
    from airflow.sdk import DAG, task
except ImportError:  # pragma: no cover - Airflow 2.11
    from airflow.decorators import task  # type: ignore[no-redef,attr-defined]
    from airflow.models.dag import DAG  # type: ignore[no-redef]

try:  # Airflow 3.x
    from airflow.sdk import Asset
except ImportError:  # pragma: no cover - Airflow 2.x calls assets "datasets"
    from airflow.datasets import Dataset as _Dataset

    def Asset(  # type: ignore[no-redef]  # noqa: N802 - stands in for the Airflow 3 class
        name: str | None = None,
        uri: str | None = None,
        *,
        group: str | None = None,
        extra: dict | None = None,
        watchers: list | None = None,
    ) -> _Dataset:
        """Airflow 2.x stand-in for ``airflow.sdk.Asset(name=..., uri=...)``: a ``Dataset``.

        An Airflow 2 ``Dataset`` is identified by its URI alone and has no ``name`` or ``group``:
        the result is ``Dataset(uri)`` (``Dataset(name)`` when only ``name`` is given, as Airflow 3
        does), so ``outlets=[...]`` and ``schedule=[...]`` work the same on 2.11 and 3.x.
        ``group`` is dropped.

        :param name: the asset name (Airflow 3); the URI when ``uri`` is not given.
        :param uri: the asset URI, e.g. ``plgd://plgd_events_etl/snapshots``.
        :param group: ignored on Airflow 2.
        :param extra: the dataset's ``extra`` dict.
        :param watchers: must be empty: ``AssetWatcher`` (event-driven scheduling) needs Airflow 3.
        :raises ValueError: neither ``name`` nor ``uri`` given.
        :raises TypeError: ``watchers`` given.
        """
        if watchers:
            raise TypeError(
                "Asset watchers (event-driven scheduling, AssetWatcher) need Airflow 3; "
                f"this is Airflow 2 (got watchers={watchers!r})"
            )
        identifier = uri or name
        if not identifier:
            raise ValueError(f"an asset needs a name or a uri (got name={name!r}, uri={uri!r})")
        return _Dataset(uri=identifier, extra=extra or None)

try:  # Airflow 3.x: the Task SDK's timetables
    from airflow.sdk.definitions.timetables.interval import (
        CronDataIntervalTimetable,
        DeltaDataIntervalTimetable,
    )
except ImportError:  # pragma: no cover - Airflow 2.x
    from airflow.timetables.interval import (  # type: ignore[no-redef,assignment]
        CronDataIntervalTimetable,
        DeltaDataIntervalTimetable,
    )

from airflow.triggers.base import BaseTrigger, TriggerEvent


def __getattr__(name: str):
    """Lazy names (their import is heavier): ``ObjectStoragePath`` (Airflow 3 ``airflow.sdk``,
    Airflow 2.x ``airflow.io.path``)."""
    if name == "ObjectStoragePath":
        try:  # Airflow 3.x
            from airflow.sdk import ObjectStoragePath
        except ImportError:  # pragma: no cover - Airflow 2.x
            from airflow.io.path import ObjectStoragePath  # type: ignore[no-redef]
        return ObjectStoragePath
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "AIRFLOW_V_3",
    "Asset",
    "BaseHook",
    "BaseOperator",
    "BaseSensorOperator",
    "BaseTrigger",
    "Context",
    "DAG",
    "CronDataIntervalTimetable",
    "DeltaDataIntervalTimetable",
    "ObjectStoragePath",  # noqa: F822 - a lazy name (module __getattr__)
    "PokeReturnValue",
    "TriggerEvent",
    "task",
]
