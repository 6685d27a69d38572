"""The one place that knows which Airflow it runs on: every Airflow API that moved between
Airflow 2.11 and 3.x is imported here, with the 3.x location first and the 2.11 one as fallback.

On Airflow 3 the public Task SDK (``airflow.sdk``) is used; on Airflow 2.11 the same names come
from their 2.x modules. The provider's modules (and the example DAGs) import these names from
here and nowhere else switch on the Airflow version:

* classes: ``BaseHook``, ``BaseOperator``, ``BaseOperatorLink``, ``BaseSensorOperator``, ``BaseTrigger``,
  ``BaseEventTrigger`` (Airflow 2: ``BaseTrigger``, there is no event-driven scheduling),
  ``Context``, ``PokeReturnValue``, ``TriggerEvent``, ``XCom``, ``DAG``, ``task``, ``Param``, ``Asset``,
  the data-interval timetables; Airflow's ``AirflowFailException`` and ``AirflowTaskTimeout``
  (used by ``exceptions.py``, ``etl/plan.py`` and ``operators/spark_submit.py``);
* what Airflow 2.11 lacks: ``AssetAlias`` is None there, and :data:`ASSET_EVENT_EXTRAS` (asset
  events carry the ``extra`` our tasks set) is False;
* partitioned assets: ``PartitionedAssetTimetable`` (None before Airflow 3.2) and
  :data:`ASSET_EVENT_PARTITIONS` (a task sets its asset events' partition keys: Airflow >= 3.3);
* lazy names (imported on first use, module ``__getattr__``): ``ObjectStoragePath``, and
  ``mask_secret`` / ``amask_secret`` (None where that Airflow has none).

``Asset`` on Airflow 2.x is a function that returns a ``Dataset`` (2.x datasets have no name).
Source: Airflow 3 migration guide ("Public Interface of Airflow", ``airflow.sdk``).
"""

from __future__ import annotations

from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

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
    from airflow.sdk import DAG, Param, task
except ImportError:  # pragma: no cover - Airflow 2.11
    from airflow.decorators import task  # type: ignore[no-redef,attr-defined]
    from airflow.models.dag import DAG  # type: ignore[no-redef]
    from airflow.models.param import Param  # type: ignore[no-redef]

try:  # Airflow 3.x: operator extra links; XCom as seen from a task (links read their XCom)
    from airflow.sdk import BaseOperatorLink
    from airflow.sdk.execution_time.xcom import XCom
except ImportError:  # pragma: no cover - Airflow 2.11
    from airflow.models.baseoperatorlink import BaseOperatorLink  # type: ignore[no-redef,assignment]
    from airflow.models.xcom import XCom  # type: ignore[no-redef,assignment]

try:  # Airflow 3.x
    from airflow.sdk.exceptions import AirflowFailException
except ImportError:  # pragma: no cover - Airflow 2.11
    from airflow.exceptions import AirflowFailException  # type: ignore[no-redef]
try:  # Airflow 3.x
    from airflow.sdk.exceptions import AirflowTaskTimeout
except ImportError:  # pragma: no cover - Airflow 2.11
    from airflow.exceptions import AirflowTaskTimeout  # type: ignore[no-redef]
# a provider's deprecations (a DeprecationWarning), as Airflow's own providers warn
from airflow.exceptions import AirflowProviderDeprecationWarning

#: Asset events carry the ``extra`` a task sets through ``outlet_events`` (Airflow 3; on Airflow
#: 2.11 our dataset events are emitted without it).
ASSET_EVENT_EXTRAS = AIRFLOW_V_3

AssetAlias: Any
if AIRFLOW_V_3:
    from airflow.sdk import AssetAlias
else:  # pragma: no cover - Airflow 2.11: no asset aliases here
    AssetAlias = None

#: Asset events of a task carry partition keys of its choosing (``outlet_events[asset].add_partitions``:
#: Airflow >= 3.3; Airflow 3.2 gives an event only the partition key of a partitioned run).
ASSET_EVENT_PARTITIONS = False
PartitionedAssetTimetable: Any = None
try:  # Airflow >= 3.2: partitioned assets
    from airflow.sdk import PartitionedAssetTimetable
    from airflow.sdk.execution_time.context import OutletEventAccessor as _OutletEventAccessor

    ASSET_EVENT_PARTITIONS = hasattr(_OutletEventAccessor, "add_partitions")
except ImportError:  # pragma: no cover - Airflow 2.11, 3.0, 3.1
    pass

try:  # Airflow 3.x
    from airflow.sdk import Asset
except ImportError:  # pragma: no cover - Airflow 2.x calls assets "datasets"
    from airflow.datasets import Dataset as _Dataset

    def Asset(  # type: ignore[no-redef]  # stands in for the Airflow 3 class
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


try:  # Airflow 3: triggers that AssetWatchers accept
    from airflow.triggers.base import BaseEventTrigger
except ImportError:  # pragma: no cover - Airflow 2.x has no event-driven scheduling; a plain trigger
    BaseEventTrigger = BaseTrigger  # type: ignore[misc,assignment]


def __getattr__(name: str):
    """Lazy names (imported on first use): ``ObjectStoragePath`` (Airflow 3 ``airflow.sdk``,
    Airflow 2.x ``airflow.io.path``); ``mask_secret`` (Airflow 3 ``airflow.sdk.log``, Airflow 2.x
    ``airflow.utils.log.secrets_masker``, else None); ``amask_secret`` (its async form, Airflow 3
    ``airflow.sdk.log`` only, else None)."""
    if name == "ObjectStoragePath":
        try:  # Airflow 3.x
            from airflow.sdk import ObjectStoragePath
        except ImportError:  # pragma: no cover - Airflow 2.x
            from airflow.io.path import ObjectStoragePath  # type: ignore[no-redef]
        return ObjectStoragePath
    if name == "mask_secret":
        try:  # Airflow 3.x
            from airflow.sdk.log import mask_secret
        except ImportError:  # pragma: no cover - Airflow 2.11
            try:
                from airflow.utils.log.secrets_masker import mask_secret  # type: ignore[no-redef]
            except ImportError:
                return None
        return mask_secret
    if name == "amask_secret":
        try:  # Airflow 3.x
            from airflow.sdk.log import amask_secret
        except ImportError:  # pragma: no cover - Airflow 2.11 / older 3.x
            return None
        return amask_secret
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "AIRFLOW_V_3",
    "ASSET_EVENT_EXTRAS",
    "ASSET_EVENT_PARTITIONS",
    "DAG",
    "AirflowFailException",
    "AirflowProviderDeprecationWarning",
    "AirflowTaskTimeout",
    "Asset",
    "AssetAlias",
    "BaseEventTrigger",
    "BaseHook",
    "BaseOperator",
    "BaseOperatorLink",
    "BaseSensorOperator",
    "BaseTrigger",
    "Context",
    "CronDataIntervalTimetable",
    "DeltaDataIntervalTimetable",
    "ObjectStoragePath",  # noqa: F822 - a lazy name (module __getattr__)
    "Param",
    "PartitionedAssetTimetable",
    "PokeReturnValue",
    "TriggerEvent",
    "XCom",
    "amask_secret",  # noqa: F822 - a lazy name
    "mask_secret",  # noqa: F822 - a lazy name
    "task",
]
