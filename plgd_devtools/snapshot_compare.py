"""Compare the latest committed snapshot tables with the simulator's expected state.

Used by ``make demo`` and the end-to-end tests. Reads the tables with pyarrow + fsspec through
``airflow_provider_plgd.tables.snapshot_store`` (no Spark needed). Rows are matched by each table's key columns
(``airflow_provider_plgd.tables.snapshot_store.sort_keys``); values are compared column by column, with
``content_json`` compared as parsed JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_plgd.tables import snapshot_store
from airflow_provider_plgd.tables.layout import Layout

TABLES = ("resources", "device_metadata", "device_links", "owner_devices")


def _normalise(column: str, value: Any) -> Any:
    if column == "content_json" and isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    if isinstance(value, tuple):
        return [_normalise(column, v) for v in value]
    if isinstance(value, list):
        return [_normalise(column, v) for v in value]
    if isinstance(value, dict):
        return {k: _normalise(k, v) for k, v in value.items()}
    return value


def _keyed(rows: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> dict[tuple, Mapping[str, Any]]:
    return {tuple(row.get(k) for k in keys): row for row in rows}


def compare_tables(
    actual: Mapping[str, Sequence[Mapping[str, Any]]],
    expected: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    keys: Mapping[str, Sequence[str]],
) -> list[str]:
    """Diff two sets of tables given as lists of row dicts.

    :param actual: ``{table: [row, ...]}`` as read from the snapshot.
    :param expected: ``{table: [row, ...]}`` from :func:`airflow_provider_plgd.simulator.expected_state`.
    :param keys: the key columns per table.
    :return: human-readable differences (missing rows, extra rows, differing columns); empty
        when the tables are equal on every column of the expected rows.
    """
    diffs: list[str] = []
    for table, expected_rows in expected.items():
        key_cols = list(keys[table])
        got = _keyed(actual.get(table, []), key_cols)
        want = _keyed(expected_rows, key_cols)
        for key in sorted(set(want) - set(got), key=str):
            diffs.append(f"{table}: missing row {dict(zip(key_cols, key, strict=True))}")
        for key in sorted(set(got) - set(want), key=str):
            diffs.append(f"{table}: unexpected row {dict(zip(key_cols, key, strict=True))}")
        for key in sorted(set(want) & set(got), key=str):
            for column, value in want[key].items():
                a, e = _normalise(column, got[key].get(column)), _normalise(column, value)
                if a != e:
                    diffs.append(f"{table} {dict(zip(key_cols, key, strict=True))}: {column} = {a!r}, expected {e!r}")
    return diffs


def read_latest_tables(root: str) -> dict[str, list[dict[str, Any]]]:
    """Read the four snapshot tables of the latest snapshot (``snapshot_store.latest``) as row dicts.

    :raises FileNotFoundError: if no snapshot has been committed under ``root``.
    """
    layout = Layout.of(root)
    if snapshot_store.latest(layout) is None:
        raise FileNotFoundError(f"no committed snapshot under {layout.snapshots_dir()} (no _device_state commit)")
    return {table: snapshot_store.read_table(layout, table).to_pylist() for table in TABLES}


def compare_snapshot(root: Any, expected: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """Compare the latest snapshot under ``root`` with ``expected``; return the differences (empty = equal)."""
    keys = {table: snapshot_store.sort_keys(table) for table in TABLES}
    return compare_tables(read_latest_tables(str(root)), expected, keys=keys)


def print_snapshot_summary(root: Any) -> None:
    """Print a short, readable summary of the latest snapshot: rows per table and per owner, samples."""
    tables = read_latest_tables(str(root))
    print(f"[demo] latest snapshot under {root}/snapshots:")
    for table in TABLES:
        rows = tables[table]
        owners: dict[str, int] = {}
        for row in rows:
            owners[row["owner_id"]] = owners.get(row["owner_id"], 0) + 1
        incomplete = sum(1 for row in rows if row.get("complete") is False)
        print(f"    {table:16s} {len(rows):6d} rows, {len(owners)} owners"
              + (f", {incomplete} incomplete" if incomplete else ""))
    online = sum(1 for row in tables["device_metadata"] if row.get("connection_status") == "ONLINE")
    print(f"    devices online: {online} of {len(tables['device_metadata'])}")
    for row in tables["resources"][:3]:
        print(f"    e.g. {row['device_id']}{row['href']}: {row.get('status')} {row.get('content_json')}")
