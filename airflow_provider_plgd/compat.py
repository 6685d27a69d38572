"""The one place that imports Airflow APIs that moved between Airflow 2.11 and 3.x.

On Airflow 3 the public Task SDK (``airflow.sdk``) is used; on Airflow 2.11 the same names
come from their 2.x modules. Every other module imports these names from here.
Source: Airflow 3 migration guide ("Public Interface of Airflow", ``airflow.sdk``).
"""

from __future__ import annotations

try:  # Airflow 3.x
    from airflow.sdk import BaseHook, BaseOperator, BaseSensorOperator, Context, PokeReturnValue

    AIRFLOW_V_3 = True
except ImportError:  # pragma: no cover - Airflow 2.11
    from airflow.hooks.base import BaseHook  # type: ignore[no-redef]
    from airflow.models import BaseOperator  # type: ignore[no-redef]
    from airflow.sensors.base import BaseSensorOperator, PokeReturnValue  # type: ignore[no-redef]
    from airflow.utils.context import Context  # type: ignore[no-redef]

    AIRFLOW_V_3 = False

try:  # Airflow 3.x
    from airflow.sdk import Asset
except ImportError:  # pragma: no cover - Airflow 2.x calls assets "datasets"
    from airflow.datasets import Dataset as Asset  # type: ignore[no-redef]

try:  # Airflow 3.x: the Task SDK's timetables
    from airflow.sdk.definitions.timetables.interval import (
        CronDataIntervalTimetable,
        DeltaDataIntervalTimetable,
    )
except ImportError:  # pragma: no cover - Airflow 2.x
    from airflow.timetables.interval import (  # type: ignore[no-redef]
        CronDataIntervalTimetable,
        DeltaDataIntervalTimetable,
    )

from airflow.triggers.base import BaseTrigger, TriggerEvent

__all__ = [
    "AIRFLOW_V_3",
    "Asset",
    "BaseHook",
    "BaseOperator",
    "BaseSensorOperator",
    "BaseTrigger",
    "Context",
    "CronDataIntervalTimetable",
    "DeltaDataIntervalTimetable",
    "PokeReturnValue",
    "TriggerEvent",
]
