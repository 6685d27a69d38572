"""Columns and types of the four snapshot tables (the contract in ``docs/data-contracts.md``,
section "Snapshot tables"); the one home of the snapshot columns and sort keys.

``airflow_provider_plgd.simulator.expected_state`` rows have exactly these keys, and the Spark
``rebuild_snapshots`` app (``airflow_provider_plgd/spark/fold/`` and
``airflow_provider_plgd/tables/snapshot_store.py``) writes exactly these columns. Times are int64 unix nanoseconds (the protobuf values, no precision lost); enums
are their protobuf names; byte strings are standard base64 text. State semantics: docs/wire-format.md
§4 and §4.9.

Part of the pure-Python plgd model: imports only pyarrow (no Airflow, Spark or nats-py), so it
ships in the Spark apps' ``--py-files`` zip (``airflow_provider_plgd/spark_deps.py``).
"""

from __future__ import annotations

import pyarrow as pa

__all__ = [
    "ENDPOINT",
    "METADATA_PENDING",
    "MISSING_RANGE",
    "RESOURCE_PENDING",
    "SNAPSHOT_SCHEMAS",
    "SNAPSHOT_SORT_KEYS",
    "SNAPSHOT_TABLES",
    "snapshot_schema",
]

#: One missing range of aggregate versions, inclusive on both ends.
MISSING_RANGE = pa.struct([("first", pa.int64()), ("last", pa.int64())])

#: An open resource command (one entry of ``*_pendings``).
RESOURCE_PENDING = pa.struct(
    [
        ("correlation_id", pa.string()),
        ("valid_until", pa.int64()),
        ("version", pa.int64()),
        ("timestamp", pa.int64()),
    ]
)

#: An open device-metadata update (``update_pendings``); exactly one of the two bools is set.
METADATA_PENDING = pa.struct(
    [
        ("correlation_id", pa.string()),
        ("twin_enabled", pa.bool_()),
        ("twin_force_synchronization", pa.bool_()),
        ("valid_until", pa.int64()),
        ("version", pa.int64()),
        ("timestamp", pa.int64()),
    ]
)

#: One endpoint of a link (``EndpointInformation``: URL text and priority).
ENDPOINT = pa.struct([("endpoint", pa.string()), ("priority", pa.int64())])

_AGGREGATE_TAIL = [
    ("version", pa.int64(), False),
    ("timestamp", pa.int64(), False),
    ("complete", pa.bool_(), False),
    ("missing_versions", pa.list_(MISSING_RANGE), False),
]

# (name, type, nullable)
_RESOURCES = [
    ("owner_id", pa.string(), False),
    ("device_id", pa.string(), False),
    ("href", pa.string(), False),
    ("aggregate_id", pa.string(), False),
    ("resource_types", pa.list_(pa.string()), False),
    ("status", pa.string(), True),
    ("content_type", pa.string(), True),
    ("coap_content_format", pa.int32(), True),
    ("content_json", pa.string(), True),
    ("etag", pa.string(), True),
    ("create_pendings", pa.list_(RESOURCE_PENDING), False),
    ("retrieve_pendings", pa.list_(RESOURCE_PENDING), False),
    ("update_pendings", pa.list_(RESOURCE_PENDING), False),
    ("delete_pendings", pa.list_(RESOURCE_PENDING), False),
    *_AGGREGATE_TAIL,
]

_DEVICE_METADATA = [
    ("owner_id", pa.string(), False),
    ("device_id", pa.string(), False),
    ("aggregate_id", pa.string(), False),
    ("connection_status", pa.string(), True),
    ("connection_id", pa.string(), True),
    ("connected_at", pa.int64(), True),
    ("connection_protocol", pa.string(), True),
    ("service_id", pa.string(), True),
    ("local_endpoints", pa.list_(pa.string()), True),
    ("twin_enabled", pa.bool_(), False),
    ("twin_synchronization_state", pa.string(), True),
    ("twin_syncing_at", pa.int64(), True),
    ("twin_in_sync_at", pa.int64(), True),
    ("twin_force_synchronization_at", pa.int64(), True),
    ("update_pendings", pa.list_(METADATA_PENDING), False),
    *_AGGREGATE_TAIL,
]

_DEVICE_LINKS = [
    ("owner_id", pa.string(), False),
    ("device_id", pa.string(), False),
    ("href", pa.string(), False),
    ("aggregate_id", pa.string(), False),
    ("resource_types", pa.list_(pa.string()), False),
    ("interfaces", pa.list_(pa.string()), False),
    ("anchor", pa.string(), False),
    ("title", pa.string(), False),
    ("supported_content_types", pa.list_(pa.string()), False),
    ("valid_until", pa.int64(), False),
    ("policy_bit_flags", pa.int32(), False),
    ("endpoint_informations", pa.list_(ENDPOINT), False),
    *_AGGREGATE_TAIL,
]

_OWNER_DEVICES = [
    ("owner_id", pa.string(), False),
    ("owner", pa.string(), False),
    ("device_id", pa.string(), False),
    ("registered_at", pa.int64(), False),
]

#: Table name -> list of (column, arrow type, nullable), in column order.
SNAPSHOT_TABLES: dict[str, list[tuple[str, pa.DataType, bool]]] = {
    "resources": _RESOURCES,
    "device_metadata": _DEVICE_METADATA,
    "device_links": _DEVICE_LINKS,
    "owner_devices": _OWNER_DEVICES,
}

#: Table name -> columns that identify a row; rows are sorted by them.
SNAPSHOT_SORT_KEYS: dict[str, tuple[str, ...]] = {
    "resources": ("owner_id", "device_id", "href"),
    "device_metadata": ("owner_id", "device_id"),
    "device_links": ("owner_id", "device_id", "href"),
    "owner_devices": ("owner_id", "device_id"),
}

#: Table name -> ``pyarrow.Schema``.
SNAPSHOT_SCHEMAS: dict[str, pa.Schema] = {
    name: pa.schema([pa.field(col, typ, nullable=nullable) for col, typ, nullable in cols])
    for name, cols in SNAPSHOT_TABLES.items()
}


def snapshot_schema(table: str) -> pa.Schema:
    """``pyarrow.Schema`` of snapshot table ``table`` (columns as :data:`SNAPSHOT_TABLES`).

    :raises ValueError: ``table`` is not one of the four snapshot tables (the message names it).
    """
    try:
        return SNAPSHOT_SCHEMAS[table]
    except KeyError:
        raise ValueError(f"unknown snapshot table {table!r}; expected one of {sorted(SNAPSHOT_SCHEMAS)}") from None
