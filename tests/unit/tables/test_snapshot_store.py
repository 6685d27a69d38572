"""The snapshot tables' names, paths and empty reads (``tables/snapshot_store.py``); the snapshot
records and readers on real tables are in tests/integration/test_dedupe_rebuild.py."""

from __future__ import annotations

import pytest

from airflow_provider_plgd import times
from airflow_provider_plgd.tables import snapshot_store
from airflow_provider_plgd.tables.layout import Layout

SEC = 1_000_000_000
T0 = 1_767_225_600 * SEC  # 2026-01-01T00:00:00Z
END = T0 + 3600 * SEC


def test_snapshot_store_names_and_empty_reads(tmp_path):
    assert snapshot_store.version_id(T0 + 3600 * SEC) == "20260101T010000Z"
    assert snapshot_store.version_id(T0 + 1500) == "20260101T000000.000001500Z"
    assert snapshot_store.version_id(T0 + 1000) == "20260101T000000.000001Z"
    # one format for snapshot versions and interval IDs: version of the interval end == its ID's end
    assert times.interval_id(T0 + 1000, END).split("_") == [
        snapshot_store.version_id(T0 + 1000), snapshot_store.version_id(END)]
    with pytest.raises(ValueError, match="snapshot time"):
        snapshot_store.version_id(-1)
    assert snapshot_store.latest(Layout.of(str(tmp_path))) is None
    table = snapshot_store.read_table(Layout.of(str(tmp_path)), "resources")
    assert table.num_rows == 0 and table.schema == snapshot_store.table_schema("resources")
    assert snapshot_store.snapshot_table_uri(Layout.of("/r"), "resources") == "/r/snapshots/resources"
    assert snapshot_store.delta_schema("resources").names[-1] == "bucket"
    with pytest.raises(ValueError, match="unknown snapshot table"):
        snapshot_store.snapshot_table_uri(Layout.of("/r"), "nope")
    assert snapshot_store.bucket_files(Layout.of(str(tmp_path)), "resources", None) == {}
    assert times.interval_kind("20260101T000000Z_20260101T010000Z") == "time"
    assert times.interval_kind("seq-000000000001-000000000009") == "seq"
