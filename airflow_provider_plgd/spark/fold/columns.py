"""The fold's input: the ``events`` columns each event type needs, and every column the rebuild
reads (:data:`FOLD_INPUT_COLUMNS`)."""

from __future__ import annotations

from airflow_provider_plgd.spark.fold.rules import _CONFIRM_KIND, _PENDING_KIND
from airflow_provider_plgd.spark.fold.state import DEVICES_REGISTERED, DEVICES_UNREGISTERED

#: ``events`` columns each event type needs (besides :data:`BASE_COLUMNS`); the Arrow glue
#: converts only these to Python, which makes the conversion several times cheaper.
BASE_COLUMNS: tuple[str, ...] = ("stream_seq", "owner_id", "event_type", "version", "aggregate_id", "timestamp")
_RESOURCE_PENDING_COLUMNS = ("href", "correlation_id", "valid_until", "resource_types")
_RESOURCE_CONFIRM_COLUMNS = ("href", "correlation_id", "status", "resource_types")
COLUMNS_BY_EVENT_TYPE: dict[str, tuple[str, ...]] = {
    "resourcechanged": ("href", "connection_id", "sequence", "user_id", "status", "content_type",
                        "coap_content_format", "content_data", "content_json", "etag",
                        "resource_types"),
    **{et: _RESOURCE_PENDING_COLUMNS for et in _PENDING_KIND},
    **{et: _RESOURCE_CONFIRM_COLUMNS for et in _CONFIRM_KIND},
    "resourcestatesnapshottaken": ("href", "resource_types", "resource_snapshot"),
    "resourcelinkspublished": ("resources",),
    "resourcelinksunpublished": ("hrefs",),
    "resourcelinkssnapshottaken": ("resources",),
    "devicemetadataupdated": ("correlation_id", "connection", "twin_enabled", "twin_synchronization", "canceled"),
    "devicemetadataupdatepending": ("correlation_id", "update_pending", "update_pending_value", "valid_until"),
    "devicemetadatasnapshottaken": ("metadata_snapshot",),
    DEVICES_REGISTERED: ("registration_owner",),
    DEVICES_UNREGISTERED: (),
}
#: Every ``events`` column the rebuild reads: the fold's columns plus the device keys
#: (``device_id``/``group_id``; ``device_ids`` of identity-store events).
FOLD_INPUT_COLUMNS: tuple[str, ...] = tuple(c for c in dict.fromkeys(
    (*BASE_COLUMNS, "device_id", "group_id", "device_ids",
     *(c for cols in COLUMNS_BY_EVENT_TYPE.values() for c in cols))
))
