"""Arrow in, Arrow out: one bucket of the rebuild folded (:func:`fold_bucket_arrow`), for the
rebuild's reduce tasks (pyarrow imported lazily; no Spark)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_plgd.spark.fold.columns import BASE_COLUMNS, COLUMNS_BY_EVENT_TYPE
from airflow_provider_plgd.spark.fold.device import fold_device
from airflow_provider_plgd.spark.fold.rows import device_rows
from airflow_provider_plgd.spark.fold.state import FoldStats, dumps_state, loads_state, next_expiry

#: Name of the internal state table in :func:`fold_output_schema` (``snapshot_store.STATE_TABLE``).
STATE_TABLE_NAME = "_device_state"


def fold_output_schema(table_schemas: Mapping[str, Any]):
    """Arrow schema of :func:`fold_bucket_arrow`'s result: one row per output row of any table.

    Columns: ``bucket`` int32, ``table`` string (a key of ``table_schemas``, or ``"_stats"``),
    ``device_id`` string, then one nullable struct column per table (named like the table, with
    that table's columns; set only on that table's rows), then ``stats_json`` string (set only on
    the one ``_stats`` row: :class:`FoldStats` as JSON).

    :param table_schemas: ``{table name: pyarrow.Schema}`` including :data:`STATE_TABLE_NAME`.
    """
    fields = [pa.field("bucket", pa.int32()), pa.field("table", pa.string()), pa.field("device_id", pa.string())]
    fields += [pa.field(name, pa.struct(list(schema))) for name, schema in table_schemas.items()]
    fields.append(pa.field("stats_json", pa.string()))
    return pa.schema(fields)


def fold_bucket_arrow(
    events,
    states,
    *,
    snapshot_time_ns: int,
    table_schemas: Mapping[str, Any],
    bucket_column: str = "_bucket",
    device_column: str = "_device",
    bucket: int | None = None,
):
    """Fold one bucket: new events + previous states of the touched devices -> output rows.

    Called once per touched bucket by :func:`airflow_provider_plgd.tables.snapshot_store.rebuild_bucket` (inside the
    rebuild's reduce tasks, ``RDD.mapPartitions``); the unit tests call it directly.

    :param events: ``pyarrow.Table`` of ``events`` rows of this bucket, plus ``bucket_column``
        (int) and ``device_column`` (the device the row applies to: ``device_id``/``group_id``,
        or one of an identity-store row's ``device_ids``, exploded one row per device).
    :param states: ``pyarrow.Table`` of ``_device_state`` rows (``device_id``, ``next_expiry_ns``,
        ``state_json``) plus ``bucket_column``: the previous state of every device to refold
        (devices with new events, and devices whose pendings expire by ``snapshot_time_ns``).
    :param snapshot_time_ns: snapshot time (unix ns).
    :param table_schemas: as for :func:`fold_output_schema`.
    :param bucket: the bucket number (default: read from ``bucket_column`` of the first row).
    :return: a ``pyarrow.Table`` with :func:`fold_output_schema` ``(table_schemas)``: for every
        device in either input, one ``_device_state`` row and its rows of each snapshot table
        (:func:`device_rows`), plus one ``_stats`` row.
    :raises ValueError: a state that does not load, or an unknown event type.
    """
    out_schema = fold_output_schema(table_schemas)
    if not events.num_rows and not states.num_rows:
        return out_schema.empty_table()
    if bucket is None:
        source = events if events.num_rows else states
        bucket = source.column(bucket_column)[0].as_py()

    by_device: dict[str, list[dict[str, Any]]] = defaultdict(list)
    if events.num_rows:
        kinds = events.column("event_type")
        present = set(events.column_names)
        for et in pc.unique(kinds).to_pylist():
            wanted = BASE_COLUMNS + COLUMNS_BY_EVENT_TYPE.get(et, tuple(events.column_names)) + (device_column,)
            part = events.filter(pc.equal(kinds, et)).select([c for c in dict.fromkeys(wanted) if c in present])
            for row in part.to_pylist():
                by_device[row[device_column]].append(row)
    previous = dict(zip(states.column("device_id").to_pylist(), states.column("state_json").to_pylist(), strict=True))
    stats = FoldStats()
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in table_schemas}
    for device_id in sorted(set(by_device) | set(previous)):
        text = previous.get(device_id)
        state = loads_state(text) if text is not None else None
        state = fold_device(device_id, state, by_device.get(device_id, ()), snapshot_time_ns=snapshot_time_ns,
                            stats=stats)
        stats["devices"] += 1
        rows[STATE_TABLE_NAME].append(
            {"device_id": device_id, "next_expiry_ns": next_expiry(state), "state_json": dumps_state(state)}
        )
        for name, table_rows in device_rows(state, snapshot_time_ns).items():
            rows[name].extend(table_rows)
    parts = []
    for name, schema in table_schemas.items():
        n = len(rows[name])
        if not n:
            continue
        data = pa.Table.from_pylist(rows[name], schema=schema).combine_chunks()
        columns = {
            "bucket": pa.array([bucket] * n, pa.int32()),
            "table": pa.array([name] * n, pa.string()),
            "device_id": data.column("device_id"),
        }
        for other in table_schemas:
            field = out_schema.field(other)
            if other == name:
                columns[other] = pa.StructArray.from_arrays(
                    [data.column(c).chunk(0) if data.column(c).num_chunks else pa.array([], f.type)
                     for c, f in zip(schema.names, schema, strict=True)],
                    fields=list(schema),
                )
            else:
                columns[other] = pa.nulls(n, field.type)
        columns["stats_json"] = pa.nulls(n, pa.string())
        parts.append(pa.table(columns, schema=out_schema))
    stats_row = {name: pa.nulls(1, out_schema.field(name).type) for name in table_schemas}
    parts.append(pa.table({
        "bucket": pa.array([bucket], pa.int32()),
        "table": pa.array(["_stats"]),
        "device_id": pa.nulls(1, pa.string()),
        **stats_row,
        "stats_json": pa.array([json.dumps(dict(stats), sort_keys=True)]),
    }, schema=out_schema))
    return pa.concat_tables(parts)
