"""``airflow_provider_plgd.tables.chain``: the chain checked from the ledger and the Delta logs.

Real Delta tables (``deltalake``) and ledger files under ``tmp_path``, written with the project's
writers (``delta_tables.commit_interval``, ``ledger.write_json``); no Spark, no server.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_plgd import times
from airflow_provider_plgd.exceptions import ChainHoleError, OutOfOrderIntervalError
from airflow_provider_plgd.spark import schemas
from airflow_provider_plgd.spark.dedupe_job import MSGID_INDEX_SCHEMA
from airflow_provider_plgd.tables import chain, delta_tables, file_records, ledger
from airflow_provider_plgd.tables.layout import Layout

T0 = datetime(2026, 3, 1, tzinfo=timezone.utc)
IDS = [times.interval_id(T0 + timedelta(hours=k), T0 + timedelta(hours=k + 1)) for k in range(6)]
STREAM = "EVENTS"


def plan(root: str, interval_id: str, total: int) -> None:
    """The ledger's ``stream.json`` of an interval whose stream held ``total`` messages."""
    ledger.write_ledger_file(f"{ledger.interval_dir(Layout.of(root), STREAM, interval_id)}/stream.json",
                      {"version": ledger.LEDGER_VERSION, "interval_id": interval_id, "total": total})


def dedupe(root: str, interval_id: str, ids: list[str]) -> None:
    """Commit a dedupe run of the interval: one msgid_index file with ``ids`` (none: no file)."""
    records = []
    if ids:
        rel = f"interval_id={interval_id}/bucket=0/part-0.parquet"
        path = f"{delta_tables.interval_table_uri(Layout.of(root), delta_tables.MSGID_INDEX)}/{rel}"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pq.write_table(pa.table({"msg_id": ids}), path)
        records.append(file_records.file_record(rel, rows=len(ids), size=os.path.getsize(path),
                                                partition={"interval_id": interval_id, "bucket": "0"}))
    delta_tables.commit_interval("dedupe", interval_id, (
        (delta_tables.MSGID_INDEX, delta_tables.interval_table_uri(Layout.of(root), delta_tables.MSGID_INDEX), MSGID_INDEX_SCHEMA,
         records, len(ids)),
        (delta_tables.EVENTS_DEDUPED, delta_tables.interval_table_uri(Layout.of(root), delta_tables.EVENTS_DEDUPED),
         schemas.EVENTS_SCHEMA, [], 0)), run_version=1, metadata={"run_version": 1})


def test_a_failed_interval_followed_by_an_empty_one_is_a_hole_until_it_is_deduplicated(tmp_path):
    """Case 5 of "No silent loss, round 4": A (messages) failed, B held none, C builds on the chain."""
    root = str(tmp_path)
    plan(root, IDS[0], 5)
    dedupe(root, IDS[0], ["m1", "m2"])
    plan(root, IDS[1], 7)  # A: decode failed, nothing committed
    plan(root, IDS[2], 0)  # B: empty
    plan(root, IDS[3], 4)  # C
    assert chain.holes_before(Layout.of(root), STREAM, IDS[3]) == [chain.Hole(IDS[1], 7)]
    with pytest.raises(ChainHoleError, match=rf"interval {IDS[3]}: dedupe refused: .*{IDS[1]} \(7 messages\)") as err:
        chain.check_no_hole(Layout.of(root), STREAM, IDS[3], stage="dedupe")
    assert err.value.holes == [IDS[1]]
    assert chain.holes_before(Layout.of(root), STREAM, IDS[1]) == []  # A itself builds on a whole chain
    dedupe(root, IDS[1], [])  # every event of A quarantined: committed without message IDs
    assert chain.holes_before(Layout.of(root), STREAM, IDS[3]) == []
    chain.check_no_hole(Layout.of(root), STREAM, IDS[3], stage="rebuild")


def test_the_holes_are_looked_for_only_after_the_latest_interval_with_message_ids(tmp_path):
    root = str(tmp_path)
    plan(root, IDS[0], 3)  # never deduplicated, but the chain was built past it (a root of earlier code)
    plan(root, IDS[1], 2)
    dedupe(root, IDS[1], ["a"])
    plan(root, IDS[2], 0)
    assert chain.holes_before(Layout.of(root), STREAM, IDS[3]) == []
    assert chain.holes_before(Layout.of(root), STREAM, IDS[1]) == [chain.Hole(IDS[0], 3)]
    assert chain.holes_before(Layout.of(root), STREAM, "seq-1-10") == []  # not a time interval: not chained by the ledger


def test_a_new_interval_older_than_the_head_is_refused_and_a_rerun_is_not(tmp_path):
    """Case 6: intervals 1 and later are done; interval 0 is new."""
    root = str(tmp_path)
    for k in (1, 2):
        plan(root, IDS[k], 3)
        dedupe(root, IDS[k], [f"m{k}"])
    log = chain.dedupe_log(Layout.of(root))
    assert log.head() == IDS[2] and log.started(IDS[1]) and not log.started(IDS[0])
    with pytest.raises(OutOfOrderIntervalError, match=rf"interval {IDS[0]}: plan refused: .* head {IDS[2]}"):
        chain.check_not_behind_head(IDS[0], log, processed_before=False, stage="plan")
    chain.check_not_behind_head(IDS[1], log, processed_before=True, stage="plan")  # a rerun
    chain.check_not_behind_head(IDS[3], log, processed_before=False, stage="plan")  # the next one
    chain.check_not_behind_head(IDS[2], log, processed_before=False, stage="plan")  # the head itself


def test_the_summary_does_not_reconcile_an_interval_behind_a_hole(tmp_path):
    from airflow_provider_plgd.tables.run_summary import collect_run_summary

    root = str(tmp_path)
    plan(root, IDS[0], 2)  # failed
    ledger.write_ledger_file(f"{ledger.interval_dir(Layout.of(root), STREAM, IDS[1])}/stream.json",
                      {"version": ledger.LEDGER_VERSION, "interval_id": IDS[1], "total": 0, "ranges": [],
                       "spark_skip": "the stream holds no message for the interval"})
    result = collect_run_summary(Layout.of(root), STREAM, IDS[1]).as_dict()
    assert result["reconciled"] is False
    assert result["chain"]["holes"] == [f"interval {IDS[0]} (2 messages) was never deduplicated"]
    assert any(p.startswith(f"the chain has a hole before this interval: interval {IDS[0]}")
               for p in result["problems"]), result["problems"]


def test_a_rerun_that_changes_an_older_intervals_ids_makes_the_later_ones_stale(tmp_path):
    """``chain.stale_intervals`` and ``chain.check_before_run`` on tables written like the Spark
    applications write them (``plgd_devtools.interval_tables``): I0's dedupe rerun with a message
    fewer makes I1 and I2 stale; a run of I2 or later is refused before any commit (it would fold
    I1); I1 may run (its rerun is the repair), and I1's rerun clears it; a rerun older than a
    snapshot whose parent is gone from the log is refused."""
    from airflow_provider_plgd.simulator import SimulationConfig, generate
    from plgd_devtools import interval_tables

    root = str(tmp_path)
    sim = generate(SimulationConfig(seed=2, owners=1, devices_per_owner=2, resources_per_device=1, intervals=3,
                                    steps_per_interval=5))
    ids = interval_tables.interval_ids(sim)
    decoded = interval_tables.decoded_intervals(sim)
    for k in range(3):
        interval_tables.commit_interval_tables(root, ids[k], *decoded[k])
    interval_tables.commit_snapshot_record(root, ids[2], ids)
    layout = Layout.of(root)
    assert chain.stale_intervals(layout) == []
    chain.check_before_run(layout, ids[2])
    interval_tables.commit_interval_tables(root, ids[0], *decoded[0])  # the same rows again: the devtools
    stale = chain.stale_intervals(layout)  # writer records no ids_changed, which counts as changed
    assert [(s.interval_id, s.because) for s in stale] == [(ids[1], ids[0]), (ids[2], ids[0])]
    with pytest.raises(chain.ChainRepairError, match=rf"interval {ids[2]}: refused: earlier interval\(s\) {ids[1]} "
                                                     "are stale"):
        chain.check_before_run(layout, ids[2])
    chain.check_before_run(layout, ids[1])
    interval_tables.commit_interval_tables(root, ids[1], *decoded[1])
    assert [s.interval_id for s in chain.stale_intervals(layout)] == [ids[2]]
    interval_tables.commit_interval_tables(root, ids[2], *decoded[2])
    assert chain.stale_intervals(layout) == []
    interval_tables.commit_snapshot_record(root, ids[2], ids[1:], parent="20000101T000000Z")  # parent not in the log
    with pytest.raises(chain.ChainRepairError, match="20000101T000000Z\\) is no longer in its Delta log"):
        chain.check_before_run(layout, ids[1])
