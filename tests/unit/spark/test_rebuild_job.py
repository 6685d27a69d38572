"""Reruns of an interval. One older than the latest snapshot (``rebuild_job.check_older_interval``,
on real Delta tables in a temp folder): unchanged input is a no-op, changed input or a snapshot no
longer kept is refused loudly (docs/reliability.md, "Reruns of old intervals"). One that selects
less than the interval's earlier run (``ledger_guards.check_selection_covers``) is refused."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from airflow_provider_plgd.tables.layout import Layout
from airflow_provider_plgd.spark import rebuild_job
from airflow_provider_plgd.tables import snapshot_store

I1, I3 = "20260101T000000Z_20260101T010000Z", "20260101T020000Z_20260101T030000Z"
V1, V3 = "20260101T010000Z", "20260101T030000Z"


def deduped(root: Path, interval: str, name: str, rows: int) -> None:
    """Commit ``rows`` rows of interval ``interval`` to ``events_deduped`` (one file ``name``)."""
    import pyarrow as pa

    from airflow_provider_plgd.tables import delta_tables, file_records
    from airflow_provider_plgd.spark import schemas
    from airflow_provider_plgd.spark.parquet_io import write_parquet_file
    from airflow_provider_plgd.tables.storage import to_fs

    uri = delta_tables.interval_table_uri(Layout.of(str(root)), delta_tables.EVENTS_DEDUPED)
    rel = f"interval_id={interval}/event_type=x/{name}"
    fs, base = to_fs(uri)
    size, meta = write_parquet_file(fs, f"{base}/{rel}", pa.table({"msg_id": [f"m{i}" for i in range(rows)]}))
    record = file_records.file_record(rel, rows=rows, size=size, partition={"interval_id": interval, "event_type": "x"},
                                      stats=file_records.parquet_stats(meta))
    delta_tables.commit_files(uri, [record], schema=schemas.EVENTS_SCHEMA, partition_by=("interval_id", "event_type"),
                              replace=delta_tables.interval_filter(interval), metadata={"interval_id": interval},
                              app_id=f"test/{interval}", run_version=time.time_ns())


def snapshot(root: Path, version: str, interval: str, inputs: dict | None) -> None:
    """Commit a snapshot record of ``version`` that folded ``interval`` (no rows)."""
    from airflow_provider_plgd.tables import delta_tables

    record = {"snapshot": version, "snapshot_time_ns": 1, "buckets": 1, "parent": None, "interval_id": interval,
              "intervals": [interval]}
    if inputs is not None:
        record["inputs"] = inputs
    delta_tables.commit_files(snapshot_store.snapshot_table_uri(Layout.of(str(root)), snapshot_store.STATE_TABLE), [],
                              schema=snapshot_store.delta_schema(snapshot_store.STATE_TABLE), partition_by=("bucket",),
                              replace=None, metadata=record, app_id=f"test/{version}", run_version=time.time_ns())


def test_unchanged_input_is_a_no_op_and_changed_input_is_refused(tmp_path):
    root = tmp_path
    deduped(root, I1, "part-00000-w1.parquet", 10)
    folded = rebuild_job.input_fingerprint(Layout.of(str(root)), I1)
    snapshot(root, V1, I1, {I1: folded})
    latest = {"version": V3, "interval_id": I3}
    # the rerun committed the same rows in the same partition files (other run-unique names): unchanged
    deduped(root, I1, "part-00000-w2.parquet", 10)
    assert rebuild_job.check_older_interval(Layout.of(str(root)), Layout.of(str(root)), latest, I1)["version"] == V1
    # fewer rows now (e.g. accept_fewer_messages after a purge): the later snapshots hold the old ones
    deduped(root, I1, "part-00000-w3.parquet", 9)
    with pytest.raises(RuntimeError, match=rf"interval {I1}: its deduplicated events changed since snapshot "
                                           rf"{V1} folded them \(10 rows then, 9 now\).*{V3}"):
        rebuild_job.check_older_interval(Layout.of(str(root)), Layout.of(str(root)), latest, I1)


def test_a_snapshot_no_longer_in_the_log_cannot_be_compared(tmp_path):
    deduped(tmp_path, I1, "part-00000-w1.parquet", 1)
    latest = {"version": V3, "interval_id": I3}
    with pytest.raises(RuntimeError, match="no snapshot in the Delta log .* records folding it"):
        rebuild_job.check_older_interval(Layout.of(str(tmp_path)), Layout.of(str(tmp_path)), latest, I1)
    snapshot(tmp_path, V1, I1, None)  # a record without inputs
    with pytest.raises(RuntimeError, match="records folding it"):
        rebuild_job.check_older_interval(Layout.of(str(tmp_path)), Layout.of(str(tmp_path)), latest, I1)





def test_a_narrower_selection_than_the_intervals_earlier_run_is_refused():
    """``ledger_guards.check_selection_covers``: the owners the earlier run staged messages for (its fetch
    records), its unrouted messages (every owner selected only) and its event types must all be
    selected again; a version-1 plan's per-owner counts count the same way."""
    from airflow_provider_plgd.tables import ledger_guards
    from airflow_provider_plgd.exceptions import NarrowerRerunError

    types = ["devicesregistered", "resourcechanged"]
    earlier = {"version": 2, "interval_id": I1, "owners": None, "event_types": types}
    records = [{"range": {"index": 0}, "owners": {"a": {"staged": 3}, "_unrouted": {"staged": 1}}},
               {"range": {"index": 1}, "owners": {"b": {"staged": 2}}}]
    ledger_guards.check_selection_covers(earlier, {**earlier}, records)
    ledger_guards.check_selection_covers(earlier, {**earlier, "event_types": [*types, "x"]}, records)
    ledger_guards.check_selection_covers(None, {**earlier, "owners": ["a"]})  # a first run may be narrow
    version1 = {"version": 1, "interval_id": I1, "owners": {"a": 3, "b": 2, "quiet": 0}, "unrouted": 1,
                "event_types": types}
    # version 3: the records hold counts per event type and the unrouted count; the owners come from
    # the earlier run's staging (staged_owners), asked only when this run selects owners
    version3 = {"version": 3, "interval_id": I1, "owners": None, "event_types": types}
    records3 = [{"version": 3, "range": {"index": 0}, "staged": 4, "unrouted": 1, "owners": 1},
                {"version": 3, "range": {"index": 1}, "staged": 2, "unrouted": 0, "owners": 1}]
    asked = []

    def staged_owners():
        asked.append(1)
        return {"a": 3, "b": 2, "_unrouted": 1}

    ledger_guards.check_selection_covers(version3, {**version3, "event_types": [*types, "x"]}, records3,
                                  staged_owners=staged_owners)
    assert asked == []  # every owner selected: no scan of the staging
    for previous, previous_records in ((earlier, records), (version1, []), (version3, records3)):
        for narrower, named in [
            ({"owners": ["a", "quiet"]}, "1 owner(s) with messages not selected now: b"),
            ({"owners": ["a", "b"]}, "the 1 unrouted message(s)"),
            ({"event_types": ["resourcechanged"]}, "1 event type(s) not selected now: devicesregistered"),
        ]:
            with pytest.raises(NarrowerRerunError) as err:
                ledger_guards.check_selection_covers(previous, {**earlier, **narrower}, previous_records,
                                              staged_owners=staged_owners)
            assert named in str(err.value) and "nothing was changed" in str(err.value)
