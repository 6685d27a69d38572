"""Reruns of an interval. One older than the latest snapshot (``rebuild_job.check_older_interval``,
on real Delta tables in a temp folder): input unchanged by content is a no-op, changed input is
rebuilt in place, a snapshot no longer kept is refused loudly (docs/reliability.md, "Reruns of old
intervals"). One that selects
less than the interval's earlier run (``ledger_guards.check_selection_covers``) is refused."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from airflow_provider_plgd.spark import rebuild_job
from airflow_provider_plgd.tables import snapshot_store
from airflow_provider_plgd.tables.layout import Layout

I1, I3 = "20260101T000000Z_20260101T010000Z", "20260101T020000Z_20260101T030000Z"
V1, V3 = "20260101T010000Z", "20260101T030000Z"


def deduped(root: Path, interval: str, name: str, rows: int, *, files: int = 1, changed: int | None = None) -> None:
    """Commit ``rows`` rows of interval ``interval`` to ``events_deduped`` in ``files`` files (named
    ``name`` + index), with the content digest dedupe records (``tables.content``); row ``changed``
    gets another subject."""
    import pyarrow as pa

    from airflow_provider_plgd.spark import schemas
    from airflow_provider_plgd.spark.parquet_io import write_parquet_file
    from airflow_provider_plgd.tables import content, delta_tables, file_records
    from airflow_provider_plgd.tables.storage import to_fs

    uri = delta_tables.interval_table_uri(Layout.of(str(root)), delta_tables.EVENTS_DEDUPED)
    fs, base = to_fs(uri)
    table = pa.table({"msg_id": [f"m{i}" for i in range(rows)],
                      "subject": ["changed" if i == changed else f"s{i}" for i in range(rows)]})
    records, digest = [], content.ContentDigest()
    cut = [round(k * rows / files) for k in range(files + 1)]
    for k in range(files):
        rel = f"interval_id={interval}/event_type=x/{name}-{k}.parquet"
        part = table.slice(cut[k], cut[k + 1] - cut[k])
        size, meta = write_parquet_file(fs, f"{base}/{rel}", part)
        partition = {"interval_id": interval, "event_type": "x"}
        records.append(file_records.file_record(rel, rows=part.num_rows, size=size, partition=partition,
                                                stats=file_records.parquet_stats(meta)))
        digest = digest.merge(content.table_digest(part, partition))
    delta_tables.commit_files(uri, records, schema=schemas.EVENTS_SCHEMA, partition_by=("interval_id", "event_type"),
                              replace=delta_tables.interval_filter(interval),
                              metadata={"interval_id": interval, "content": {interval: digest.as_dict()}},
                              app_id=f"test/{interval}", run_version=time.time_ns())


def snapshot(root: Path, version: str, interval: str, inputs: dict | None, parent: str | None = None) -> None:
    """Commit a snapshot record of ``version`` that folded ``interval`` (no rows)."""
    from airflow_provider_plgd.tables import delta_tables

    record = {"snapshot": version, "snapshot_time_ns": 1, "buckets": 1, "parent": parent, "interval_id": interval,
              "intervals": [interval]}
    if inputs is not None:
        record["inputs"] = inputs
    delta_tables.commit_files(snapshot_store.snapshot_table_uri(Layout.of(str(root)), snapshot_store.STATE_TABLE), [],
                              schema=snapshot_store.delta_schema(snapshot_store.STATE_TABLE), partition_by=("bucket",),
                              replace=None, metadata=record, app_id=f"test/{version}", run_version=time.time_ns())


def test_the_same_rows_in_other_files_are_unchanged_and_a_changed_row_is_repaired(tmp_path):
    """Compared by content digest, not by files: the same rows in 3 files instead of 1 (a
    compaction's or another fetch split's layout) are unchanged; one row with another value, in
    files of the same sizes, is changed (the rebuild then repairs in place on the parent)."""
    root, layout = tmp_path, Layout.of(str(tmp_path))
    deduped(root, I1, "part-00000-w1", 10)
    folded = rebuild_job.input_fingerprint(layout, I1)
    assert folded["rows"] == 10 and folded["digest"]
    snapshot(root, V1, I1, {I1: folded})
    latest = {"version": V3, "interval_id": I3}
    deduped(root, I1, "part-00000-w2", 10, files=3)
    record, changed = rebuild_job.check_older_interval(layout, layout, latest, I1)
    assert record["version"] == V1 and changed is False
    deduped(root, I1, "part-00000-w3", 10, files=3, changed=4)
    record, changed = rebuild_job.check_older_interval(layout, layout, latest, I1)
    assert record["version"] == V1 and changed is True


def test_a_snapshot_no_longer_in_the_log_cannot_be_compared(tmp_path):
    from airflow_provider_plgd.tables.chain import ChainRepairError

    deduped(tmp_path, I1, "part-00000-w1", 1)
    latest = {"version": V3, "interval_id": I3}
    with pytest.raises(ChainRepairError, match=r"no snapshot in the Delta log .* records folding it"):
        rebuild_job.check_older_interval(Layout.of(str(tmp_path)), Layout.of(str(tmp_path)), latest, I1)
    snapshot(tmp_path, V1, I1, None)  # a record without inputs
    with pytest.raises(ChainRepairError, match="records folding it"):
        rebuild_job.check_older_interval(Layout.of(str(tmp_path)), Layout.of(str(tmp_path)), latest, I1)
    # changed rows, and the snapshot before the one that folded it is gone: no repair in place
    snapshot(tmp_path, V1, I1, {I1: {"rows": 1, "ids": "0", "digest": "1"}}, parent="20251231T230000Z")
    with pytest.raises(ChainRepairError, match="20251231T230000Z\) is no longer in the Delta log"):
        rebuild_job.check_older_interval(Layout.of(str(tmp_path)), Layout.of(str(tmp_path)), latest, I1)


def test_a_narrower_selection_than_the_intervals_earlier_run_is_refused():
    """``ledger_guards.check_selection_covers``: the owners the earlier run staged messages for (its fetch
    records), its unrouted messages (every owner selected only) and its event types must all be
    selected again; a version-1 plan's per-owner counts count the same way."""
    from airflow_provider_plgd.exceptions import NarrowerRerunError
    from airflow_provider_plgd.tables import ledger_guards

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
