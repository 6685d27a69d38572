"""The one home of the schemas of the ``events`` and ``quarantine`` tables (Arrow and Spark).

Written by ``spark_apps/decode_events.py``; read by ``dedupe_events`` and ``rebuild_snapshots``.
Column meanings, units and the on-disk layout are documented in ``docs/events.md``; the fields
come from ``docs/wire-format.md`` §2 (envelope), §3 (inner messages) and §5 (content).

Conventions
-----------
* Every column is nullable. A column that the event type does not carry is null (for example
  ``href`` of a ``devicemetadataupdated``); a proto3 field that the event type *does* carry keeps
  its wire value, including defaults (``""``, ``0``, ``false``, empty lists).
* Times from the payload (``timestamp``, ``valid_until``, ``connected_at`` ...) are ``int64`` unix
  **nanoseconds**, as on the wire. ``published_at`` (JetStream server time) is
  ``timestamp[us, UTC]`` (Parquet ``TIMESTAMP_MICROS``, never INT96).
* ``uint64`` wire fields (``version``, ``sequence``, ``priority``) are stored as ``int64``; a value
  above 2**63-1 would wrap to negative (two's complement); plgd never comes near that.
* Enums are stored as their proto name strings (``"OK"``, ``"ONLINE"``, ``"IN_SYNC"`` ...).
* ``*_SCHEMA`` are the Arrow schemas of *rows* and of the Delta tables; the partition columns
  (``airflow_provider_plgd.tables.delta_tables.INTERVAL_TABLES``: ``interval_id``, and ``event_type`` of
  ``events``) are in the Delta log, not in the Parquet files.

Only ``pyarrow`` is imported at module level; the Spark helpers import ``pyspark`` lazily, so this
module also works where only the pure-Python decoder runs (unit tests, benchmark).
"""

from __future__ import annotations

import pyarrow as pa

# ----------------------------------------------------------------------------------------------
# Nested types
# ----------------------------------------------------------------------------------------------

#: ``EndpointInformation`` (§3.3): ``endpoint`` string, ``priority`` uint64 -> int64.
ENDPOINT_INFORMATION_TYPE = pa.struct([
    pa.field("endpoint", pa.string()),
    pa.field("priority", pa.int64()),
])

#: ``Resource`` (a link, §3.3); ``policy.bit_flags`` is flattened to ``bit_flags``;
#: ``valid_until`` unix ns (0 = no expiry).
RESOURCE_LINK_TYPE = pa.struct([
    pa.field("href", pa.string()),
    pa.field("device_id", pa.string()),
    pa.field("resource_types", pa.list_(pa.string())),
    pa.field("interfaces", pa.list_(pa.string())),
    pa.field("anchor", pa.string()),
    pa.field("title", pa.string()),
    pa.field("supported_content_types", pa.list_(pa.string())),
    pa.field("valid_until", pa.int64()),
    pa.field("bit_flags", pa.int32()),
    pa.field("endpoint_informations", pa.list_(ENDPOINT_INFORMATION_TYPE)),
])

#: ``Connection`` (§3.3); ``status`` "OFFLINE"/"ONLINE", ``protocol`` enum name, ``connected_at`` ns.
CONNECTION_TYPE = pa.struct([
    pa.field("status", pa.string()),
    pa.field("id", pa.string()),
    pa.field("connected_at", pa.int64()),
    pa.field("protocol", pa.string()),
    pa.field("service_id", pa.string()),
    pa.field("local_endpoints", pa.list_(pa.string())),
])

#: ``TwinSynchronization`` (§3.3); ``command_metadata`` flattened to ``command_connection_id`` /
#: ``command_sequence``; times unix ns.
TWIN_SYNCHRONIZATION_TYPE = pa.struct([
    pa.field("state", pa.string()),
    pa.field("syncing_at", pa.int64()),
    pa.field("in_sync_at", pa.int64()),
    pa.field("command_connection_id", pa.string()),
    pa.field("command_sequence", pa.int64()),
    pa.field("force_synchronization_at", pa.int64()),
])

# Fields shared by the event-like nested structs: the flattened EventMetadata + AuditContext.
_META_FIELDS = [
    pa.field("version", pa.int64()),
    pa.field("timestamp", pa.int64()),
    pa.field("connection_id", pa.string()),
    pa.field("sequence", pa.int64()),
    pa.field("hub_id", pa.string()),
    pa.field("user_id", pa.string()),
    pa.field("correlation_id", pa.string()),
    pa.field("owner", pa.string()),
]
_CONTENT_FIELDS = [
    pa.field("content_type", pa.string()),
    pa.field("coap_content_format", pa.int32()),
    pa.field("content_data", pa.binary()),
    pa.field("content_json", pa.string()),
]

#: ``ResourceChanged`` inside an old-hub ``resourcestatesnapshottaken`` (latest change).
RESOURCE_CHANGE_TYPE = pa.struct(
    [
        *_META_FIELDS,
        pa.field("status", pa.string()),
        *_CONTENT_FIELDS,
        pa.field("etag", pa.binary()),
        pa.field("resource_types", pa.list_(pa.string())),
    ]
)

#: One pending command inside a resource snapshot. The same struct for the four kinds
#: (create/retrieve/update/delete); a field the kind does not have is null (e.g. ``etags`` is only
#: set for retrieve pendings, content only for create/update).
RESOURCE_PENDING_TYPE = pa.struct(
    [
        *_META_FIELDS,
        pa.field("resource_interface", pa.string()),
        *_CONTENT_FIELDS,
        pa.field("valid_until", pa.int64()),
        pa.field("etags", pa.list_(pa.binary())),
        pa.field("resource_types", pa.list_(pa.string())),
    ]
)

#: Payload of an old-hub ``resourcestatesnapshottaken`` (§3.2); the snapshot's own resource_id,
#: audit context, event metadata and resource_types are in the top-level columns.
RESOURCE_SNAPSHOT_TYPE = pa.struct([
    pa.field("latest_resource_change", RESOURCE_CHANGE_TYPE),
    pa.field("create_pendings", pa.list_(RESOURCE_PENDING_TYPE)),
    pa.field("retrieve_pendings", pa.list_(RESOURCE_PENDING_TYPE)),
    pa.field("update_pendings", pa.list_(RESOURCE_PENDING_TYPE)),
    pa.field("delete_pendings", pa.list_(RESOURCE_PENDING_TYPE)),
])

#: ``DeviceMetadataUpdated`` inside an old-hub ``devicemetadatasnapshottaken``.
DEVICE_METADATA_UPDATED_TYPE = pa.struct(
    [
        *_META_FIELDS,
        pa.field("connection", CONNECTION_TYPE),
        pa.field("twin_enabled", pa.bool_()),
        pa.field("twin_synchronization", TWIN_SYNCHRONIZATION_TYPE),
        pa.field("canceled", pa.bool_()),
    ]
)

#: ``DeviceMetadataUpdatePending`` inside an old-hub ``devicemetadatasnapshottaken``;
#: ``update_pending`` is "twin_enabled" / "twin_force_synchronization" / null, value in
#: ``update_pending_value``; ``valid_until`` ns.
DEVICE_METADATA_PENDING_TYPE = pa.struct(
    [
        *_META_FIELDS,
        pa.field("update_pending", pa.string()),
        pa.field("update_pending_value", pa.bool_()),
        pa.field("valid_until", pa.int64()),
    ]
)

#: Payload of an old-hub ``devicemetadatasnapshottaken`` (§3.2).
METADATA_SNAPSHOT_TYPE = pa.struct([
    pa.field("device_metadata_updated", DEVICE_METADATA_UPDATED_TYPE),
    pa.field("update_pendings", pa.list_(DEVICE_METADATA_PENDING_TYPE)),
])

# ----------------------------------------------------------------------------------------------
# Table schemas
# ----------------------------------------------------------------------------------------------

#: The ``events`` table: one row per decoded message (see docs/events.md for every column).
EVENTS_SCHEMA = pa.schema([
    # the JetStream message (staging columns)
    pa.field("stream", pa.string()),
    pa.field("stream_seq", pa.int64()),
    pa.field("published_at", pa.timestamp("us", tz="UTC")),
    pa.field("subject", pa.string()),
    # from the subject (§1)
    pa.field("owner_id", pa.string()),
    pa.field("device_id", pa.string()),
    pa.field("href_id", pa.string()),
    pa.field("lead_resource_type", pa.string()),
    # envelope (§2.2); null for identity-store events
    pa.field("event_type", pa.string()),
    pa.field("version", pa.int64()),
    pa.field("group_id", pa.string()),
    pa.field("aggregate_id", pa.string()),
    # event metadata (§3.2 EventMetadata; identity-store: timestamp + hub_id)
    pa.field("timestamp", pa.int64()),
    pa.field("connection_id", pa.string()),
    pa.field("sequence", pa.int64()),
    pa.field("hub_id", pa.string()),
    # audit context
    pa.field("user_id", pa.string()),
    pa.field("correlation_id", pa.string()),
    pa.field("owner", pa.string()),
    # resource fields
    pa.field("href", pa.string()),
    pa.field("resource_types", pa.list_(pa.string())),
    pa.field("status", pa.string()),
    pa.field("resource_interface", pa.string()),
    pa.field("valid_until", pa.int64()),
    pa.field("etag", pa.binary()),
    pa.field("etags", pa.list_(pa.binary())),
    # content (§5)
    pa.field("content_type", pa.string()),
    pa.field("coap_content_format", pa.int32()),
    pa.field("content_data", pa.binary()),
    pa.field("content_json", pa.string()),
    # links
    pa.field("resources", pa.list_(RESOURCE_LINK_TYPE)),
    pa.field("hrefs", pa.list_(pa.string())),
    # device metadata
    pa.field("connection", CONNECTION_TYPE),
    pa.field("twin_enabled", pa.bool_()),
    pa.field("twin_synchronization", TWIN_SYNCHRONIZATION_TYPE),
    pa.field("canceled", pa.bool_()),
    pa.field("update_pending", pa.string()),
    pa.field("update_pending_value", pa.bool_()),
    # registrations (identity store)
    pa.field("registration_owner", pa.string()),
    pa.field("device_ids", pa.list_(pa.string())),
    # old-hub snapshots
    pa.field("resource_snapshot", RESOURCE_SNAPSHOT_TYPE),
    pa.field("metadata_snapshot", METADATA_SNAPSHOT_TYPE),
    # identity and partitioning
    pa.field("msg_id", pa.string()),
    pa.field("interval_id", pa.string()),
    pa.field("date", pa.date32()),
])

#: The ``quarantine`` table: the raw staging row + why it could not be decoded.
#: ``reason`` is a ``PlgdDecodeError.reason`` (bad_snappy, bad_protobuf, unknown_event_type,
#: bad_subject, subject_mismatch); ``stage`` the pipeline stage that quarantined it ("decode").
QUARANTINE_SCHEMA = pa.schema([
    pa.field("stream", pa.string()),
    pa.field("stream_seq", pa.int64()),
    pa.field("subject", pa.string()),
    pa.field("published_at", pa.timestamp("us", tz="UTC")),
    pa.field("msg_id", pa.string()),
    pa.field("headers", pa.map_(pa.string(), pa.string())),
    pa.field("data", pa.binary()),
    pa.field("reason", pa.string()),
    pa.field("detail", pa.string()),
    pa.field("stage", pa.string()),
    pa.field("interval_id", pa.string()),
])

#: Output of the decoder (one row per staging row): every ``events`` column followed by the
#: quarantine-only columns. A row with ``reason`` null is an event (``headers``/``data``/
#: ``detail``/``stage`` null); a row with ``reason`` set is quarantined (only the staging columns,
#: ``msg_id`` = the raw header value, ``interval_id``, ``reason``, ``detail``, ``stage`` set).
UNION_SCHEMA = pa.schema(
    list(EVENTS_SCHEMA)
    + [f for f in QUARANTINE_SCHEMA if f.name not in EVENTS_SCHEMA.names]
)

EVENTS_COLUMNS: tuple[str, ...] = tuple(EVENTS_SCHEMA.names)
QUARANTINE_COLUMNS: tuple[str, ...] = tuple(QUARANTINE_SCHEMA.names)
UNION_COLUMNS: tuple[str, ...] = tuple(UNION_SCHEMA.names)

#: The ``events`` columns that are not a message's content: where and when JetStream stored it
#: (``stream``, ``stream_seq``, ``published_at``), its ID (``msg_id``) and our partition columns
#: (``interval_id``, ``date``). Every other column is decoded from the subject and the payload.
NOT_CONTENT_COLUMNS = frozenset({"stream", "stream_seq", "published_at", "msg_id", "interval_id", "date"})
#: The ``events`` columns whose values make a message's content digest
#: (:mod:`airflow_provider_plgd.spark.content_digest`), in schema order.
CONTENT_COLUMNS: tuple[str, ...] = tuple(c for c in EVENTS_COLUMNS if c not in NOT_CONTENT_COLUMNS)


# ----------------------------------------------------------------------------------------------
# Spark
# ----------------------------------------------------------------------------------------------

def to_spark_schema(schema: pa.Schema):
    """Convert an Arrow schema of this module to a ``pyspark.sql.types.StructType``.

    ``timestamp[us, UTC]`` -> ``TimestampType``, ``date32`` -> ``DateType``, lists -> ``ArrayType``,
    map -> ``MapType``, int32/int64 -> ``IntegerType``/``LongType``. Imports pyspark lazily.
    """
    # lazy: pyspark only for a Spark schema (the Arrow schemas import without it)
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema, prefer_timestamp_ntz=False)


def events_spark_schema():
    """Spark ``StructType`` of an ``events`` row (all columns, including the partition columns)."""
    return to_spark_schema(EVENTS_SCHEMA)


def quarantine_spark_schema():
    """Spark ``StructType`` of a ``quarantine`` row."""
    return to_spark_schema(QUARANTINE_SCHEMA)


def union_spark_schema():
    """Spark ``StructType`` of the decoder output (``UNION_SCHEMA``)."""
    return to_spark_schema(UNION_SCHEMA)
