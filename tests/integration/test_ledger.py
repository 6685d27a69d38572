"""The interval ledger through real parts: what the stream holds, and every stage accounting for it.

Real nats-server (``jetstream`` fixture), real Airflow ``dag.test()`` of the ETL DAG with its Spark
tasks on the session's real Spark Connect server (the first test: it proves the ledger, not
``spark-submit``; docs/testing.md), and the fetch operator / plan step against the real server
(the others). Each test names the case of ``docs/reliability.md`` ("The interval ledger") it
covers; each failed on the code before the ledger. The fetch's accounting per owner and range, and odd
owner tokens: test_ledger_fetch.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from airflow_provider_plgd import times
from airflow_provider_plgd.exceptions import FewerMessagesError, LedgerError
from airflow_provider_plgd.tables import ledger
from airflow_provider_plgd.tables.layout import Layout
from plgd_devtools.nats_server import recreate_stream
from tests.integration.conftest import load_test_dag, publish_messages, read_stream, use_spark_connect
from tests.integration.delta_read import staging_rows
from tests.integration.ledger_runs import (
    DEV,
    HREF,
    O1,
    O2,
    UTC,
    bounds_around,
    fetch_ranges,
    plan_ledger,
    run_op,
    traffic,
)

# ---------------------------------------------------------------------------------------------
# Case 1: unknown event types, malformed subjects, unrouted subjects and old-hub snapshots,
# through the whole ETL DAG (real Airflow, real Spark Connect server)
# ---------------------------------------------------------------------------------------------
ETL_DAG_FILE = """
import tempfile
from datetime import datetime, timedelta, timezone
from airflow_provider_plgd.etl import build_etl_dag

dag = build_etl_dag(dag_id="plgd_test_ledger_etl", schedule=timedelta(seconds=INTERVAL),
                    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc), catchup=False,
                    spark_connect_conn_id="plgd_spark_connect_test", default_args={"retries": 0},
                    storage_roots=[tempfile.gettempdir()])  # runs choose their root below it
"""


@pytest.mark.spark
@pytest.mark.airflow
def test_unknown_types_bad_and_unrouted_subjects_reach_quarantine_and_the_ledger_adds_up(
        jetstream, dags_folder, storage_root, spark_connect_server, monkeypatch):
    from airflow_provider_plgd.simulator import SimulationConfig, expected_state, generate, publish
    from plgd_devtools.snapshot_compare import compare_snapshot
    from plgd_devtools.spark import spark_lock

    use_spark_connect(monkeypatch, spark_connect_server)
    interval = 8
    dag = load_test_dag(dags_folder, "plgd_test_ledger_etl", ETL_DAG_FILE.replace("INTERVAL", str(interval)),
                        "plgd_test_ledger_etl")

    start_s = (int(time.time() // interval) + 1) * interval
    sim = generate(SimulationConfig(seed=3, owners=2, devices_per_owner=2, resources_per_device=2, intervals=1,
                                    steps_per_interval=25, interval_seconds=interval,
                                    start_time_ns=int(start_s * 1e9), old_hub_snapshots=True, corrupt=2))
    publish(sim, servers=[jetstream.url], stream="EVENTS", wait_for_intervals=True)
    owner = sim.messages[0].subject.split(".")[2]
    strange = [
        # a newer hub's event type under a valid owner: staged in the owner's _unknown batch
        (f"plgd.owners.{owner}.devices.{DEV}.resources.{HREF}.resourcemigrated", b"\x00\x01", None),
        # not a plgd subject form, valid owner
        (f"plgd.owners.{owner}.bogus", b"x", None),
        # unrouted: no valid owner token, or outside plgd.owners
        ("plgd.owners.bad=owner.registrations.devicesregistered", b"y", None),
        ("plgd.status.ping", b"z", None),
    ]
    publish_messages(jetstream.url, strange)
    end_s = start_s + interval
    truth = read_stream(jetstream.url)
    assert all(start_s * 1e9 <= t < end_s * 1e9 for _s, t, _h, _d in truth.values()), \
        "publishing took longer than the interval"
    time.sleep(max(0.0, end_s + 0.5 - time.time()))
    snapshots = [s for s, _t, _h, _d in truth.values() if s.endswith("snapshottaken")]
    assert snapshots, "the simulation has old-hub snapshots"

    end = datetime.fromtimestamp(end_s, tz=UTC)
    with spark_lock():
        dr = dag.test(logical_date=end, run_conf={"storage_root": storage_root, "settle_seconds": 0})
    assert "success" in str(dr.state).lower(), dr.state
    interval_id = times.interval_id(end - timedelta(seconds=interval), end)

    ledger_dir = Layout.of(storage_root).ledger_interval_dir("EVENTS", interval_id)
    record = json.loads(Path(f"{ledger_dir}/stream.json").read_text())
    assert record["total"] == len(truth)
    assert record["owners"] is None and record["deleted_in_range"] == 0
    summary = json.loads(Path(f"{ledger_dir}/summary.json").read_text())
    assert summary["reconciled"] is True and summary["problems"] == []
    chain = summary["chain"]
    assert chain["stream_total"] == chain["staged"] == len(truth)
    assert chain["unrouted"] == 2 and chain["owners_per_range"] == [2] * record["fetch_ranges"]
    assert chain["skipped"] == {}
    assert chain["decoded"] + chain["quarantined"] == len(truth)
    assert sum(chain["quarantined_per_reason"].values()) == chain["quarantined"]


    from airflow_provider_plgd.plgd.codec import DECODE_ERROR_REASONS
    from tests.integration.delta_read import read_both

    quarantine = read_both(f"{storage_root}/quarantine", "stream_seq", interval_id=interval_id)
    reason_of = {row["subject"]: row["reason"] for row in quarantine}
    assert {s for s, _d, _h in strange} <= set(reason_of)  # each one in quarantine, with a reason
    assert all(reason_of[s] in DECODE_ERROR_REASONS for s, _d, _h in strange), reason_of
    assert reason_of[strange[0][0]] == "unknown_event_type"
    assert reason_of["plgd.status.ping"] == "bad_subject"
    events = read_both(f"{storage_root}/events", "stream_seq", interval_id=interval_id)
    assert {row["event_type"] for row in events} >= {"resourcestatesnapshottaken"} & {
        s.rsplit(".", 1)[-1] for s in snapshots}
    assert len(events) + len(quarantine) == len(truth)
    assert compare_snapshot(storage_root, expected_state(sim, through_interval=0)) == []
    # every snapshot table read by engines that are not ours: the truth's rows, same devices
    for table, rows in expected_state(sim, through_interval=0).items():
        got = read_both(f"{storage_root}/snapshots/{table}", "device_id")
        assert len(got) == len(rows) and sorted(r["device_id"] for r in got) == sorted(r["device_id"] for r in rows)

    # The run's asset events carry the interval and its counts: one staging event (not one per
    # fetch task), a quarantine event because rows were quarantined, the snapshot version.
    from tests.integration.test_etl_dag_ux import asset_events

    p = "plgd_test_ledger_etl."
    runs = {app: json.loads(Path(f"{storage_root}/_runs/{app}/interval={interval_id}.json").read_text())
            for app in ("decode", "dedupe", "rebuild")}
    versions = {t: v for app in runs.values() for t, v in (app.get("delta_versions") or {}).items()}
    assert asset_events(dr) == {
        p + "staging": [{"interval_id": interval_id, "messages": len(truth), "owners": "all",
                         "fetch_ranges": record["fetch_ranges"]}],
        p + "events": [{"interval_id": interval_id, "decoded": chain["decoded"], "table": f"{storage_root}/events",
                        "delta_version": versions["events"]}],
        p + "quarantine": [{"interval_id": interval_id, "quarantined": chain["quarantined"],
                            "per_reason": chain["quarantined_per_reason"], "table": f"{storage_root}/quarantine",
                            "delta_version": versions["quarantine"]}],
        p + "events_deduped": [{"interval_id": interval_id, "kept": chain["kept"],
                                "duplicates": chain["dedupe_input"] - chain["kept"],
                                "table": f"{storage_root}/events_deduped", "delta_version": versions["events_deduped"]}],
        p + "snapshots": [{"interval_id": interval_id, "snapshot_version": chain["snapshot_version"],
                           "rows": runs["rebuild"]["rows"],
                           "tables": {t: f"{storage_root}/snapshots/{t}" for t in runs["rebuild"]["rows"]},
                           "delta_versions": {t: versions[t] for t in runs["rebuild"]["rows"]}}],
    }
    # the Delta versions named are the tables' current ones (deltalake)
    from tests.integration.delta_read import delta_table

    for table in ("events", "quarantine", "events_deduped", "snapshots/resources"):
        assert delta_table(f"{storage_root}/{table}").version() == versions[table.split("/")[-1]]
    assert chain["quarantined"] > 0 and chain["snapshot_version"]
    assert chain["selection"]["owners"] == "all"
    assert chain["selection"]["event_types_count"] == len(record["event_types"])

    # A narrower rerun of the interval (docs/reliability.md, "A narrower rerun"): one owner, or one
    # event type, would replace the interval's rows in every table and so delete the others'; it is
    # refused in plan, without retries, and every table keeps what it held (before: every task
    # succeeded, the summary reconciled, and the other owner's rows were gone).
    from airflow_provider_plgd.tables import snapshot_store

    def deduped_ids() -> list[str]:
        return sorted(r["msg_id"] for r in read_both(f"{storage_root}/events_deduped", "msg_id",
                                                      interval_id=interval_id))

    kept, latest = deduped_ids(), snapshot_store.latest(Layout.of(storage_root))
    for narrower in ({"owners": [owner]}, {"event_types": ["devicesregistered", "resourcechanged"]}):
        with spark_lock():
            rerun = dag.test(logical_date=end, run_conf={"storage_root": storage_root, "settle_seconds": 0,
                                                         **narrower})
        states = {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in rerun.get_task_instances()
                  if ti.map_index in (-1, 0)}
        assert states["plan"] == "failed" and states["decode"] == "upstream_failed", (narrower, states)
        assert [ti.try_number for ti in rerun.get_task_instances() if ti.task_id == "plan"] == [1]  # no retry
        assert json.loads(Path(f"{ledger_dir}/stream.json").read_text()) == record  # the ledger is untouched
        assert deduped_ids() == kept
        assert snapshot_store.latest(Layout.of(storage_root)) == latest
        assert compare_snapshot(storage_root, expected_state(sim, through_interval=0)) == []


# ---------------------------------------------------------------------------------------------
# Case 3: a re-created stream must not blank good staging
# ---------------------------------------------------------------------------------------------
def test_rerun_after_the_stream_was_recreated_refuses_to_commit_fewer(jetstream, storage_root):
    publish_messages(jetstream.url, traffic(25))  # 50 per owner
    start_ns, end_ns = bounds_around(jetstream.url)
    kw = dict(owner_ids=[O1, O2], event_types=["devicesregistered", "resourcechanged"], storage_root=storage_root,
              start_time=start_ns, end_time=end_ns)
    plan_ledger(storage_root, start_ns, end_ns)
    first = run_op(**kw)
    assert first["count"] == 100
    before = staging_rows(storage_root)
    assert len(before) == 100

    recreate_stream(jetstream.url)  # a lost NATS volume, or `nats stream rm/add`
    with pytest.raises(FewerMessagesError, match=r"now holds 0 messages for owner .* but 50 are committed"):
        run_op(**kw)
    assert staging_rows(storage_root) == before  # untouched
    with pytest.raises(FewerMessagesError, match="was re-created"):
        plan_ledger(storage_root, start_ns, end_ns)
    assert staging_rows(storage_root) == before

    # asked for explicitly, the rerun replaces them
    plan_ledger(storage_root, start_ns, end_ns, accept_fewer=True)
    again = run_op(accept_fewer_messages="True", **kw)
    assert again["count"] == 0
    assert staging_rows(storage_root) == []


# ---------------------------------------------------------------------------------------------
# Case 4: decode reads exactly the rows the ledger recorded, from the staging table's log
# ---------------------------------------------------------------------------------------------
def test_decode_refuses_an_interval_whose_fetch_records_do_not_add_up(jetstream, storage_root):
    from airflow_provider_plgd.spark.decode_job import ledger_files

    publish_messages(jetstream.url, traffic(10))
    start_ns, end_ns = bounds_around(jetstream.url)
    record = plan_ledger(storage_root, start_ns, end_ns)
    interval = record["interval_id"]
    (out,) = fetch_ranges(storage_root, record)
    assert (out["count"], out["batches"], out["owners"], out["files"]) == (40, 4, 2, 2)  # 2 owners x 2 types
    assert out["record"].startswith(f"{storage_root}/_ledger/") and len(json.dumps(out)) < 1500  # small XCom
    files = ledger_files(Layout.of(storage_root), "EVENTS", interval)
    assert len(files) == 2 and {f.event_type for f in files} == {"devicesregistered", "resourcechanged"}
    assert sum(f.rows for f in files) == 40 == len(staging_rows(storage_root, interval_id=interval))
    path = f"{Layout.of(storage_root).ledger_interval_dir('EVENTS', interval)}/fetch/{ledger.range_record_name(0)}"
    good = ledger.read_ledger_file(path)
    assert good["event_types"]["resourcechanged"]["count"] == 20 and good["event_types"]["resourcechanged"]["batches"] == 2
    assert "owners" in good and not isinstance(good["owners"], dict)  # a number, nothing per owner

    # a record whose event types do not sum to what it says it staged (changed afterwards)
    doctored = json.loads(json.dumps(good))
    doctored["event_types"]["resourcechanged"]["count"] -= 1
    ledger.write_ledger_file(path, doctored)
    with pytest.raises(LedgerError, match=r"range 0: its event types hold 39 messages, its record says 40 staged"):
        ledger_files(Layout.of(storage_root), "EVENTS", interval)
    # a record that adds up but does not match the table's rows
    doctored["staged"] -= 1
    doctored["skipped"] = {"event_type_not_requested": 1}
    ledger.write_ledger_file(path, doctored)
    with pytest.raises(LedgerError, match=r"range 0, event type resourcechanged: the staging table holds 20 rows, "
                                          r"the fetch record 19"):
        ledger_files(Layout.of(storage_root), "EVENTS", interval)
    # a record of another run of the plan
    ledger.write_ledger_file(path, {**good, "run_version": good["run_version"] - 1})
    with pytest.raises(LedgerError, match=r"range 0: its fetch record is of the plan's run"):
        ledger_files(Layout.of(storage_root), "EVENTS", interval)
    ledger.write_ledger_file(path, good)
    assert len(ledger_files(Layout.of(storage_root), "EVENTS", interval)) == 2
    # staging rows the ledger does not name (another DAG's batch of the same interval ID) are refused
    run_op(owner_id=O1, event_type="devicesregistered", storage_root=storage_root, start_time=start_ns,
           end_time=end_ns)
    with pytest.raises(LedgerError, match=r"staging file .*/b\.[^ ]+ \(10 rows\) is not of a range of the plan's run"):
        ledger_files(Layout.of(storage_root), "EVENTS", interval)

    # a range the plan counted but no fetch task recorded
    ledger.clear_fetch_records(Layout.of(storage_root), "EVENTS", interval)
    with pytest.raises(LedgerError, match=r"range 0 \(sequences \[1, 41\)\): the stream holds 40 messages, "
                                          "no fetch task recorded it"):
        ledger_files(Layout.of(storage_root), "EVENTS", interval)


# ---------------------------------------------------------------------------------------------
# Case 9: deletes in the middle of the stream
# ---------------------------------------------------------------------------------------------
def test_deletes_in_the_middle_are_recorded_and_a_rerun_with_fewer_is_refused(jetstream, storage_root):
    import nats

    seqs = publish_messages(jetstream.url, traffic(10))
    start_ns, end_ns = bounds_around(jetstream.url)

    async def delete(seq_list):
        nc = await nats.connect(jetstream.url)
        try:
            for seq in seq_list:
                await nc.jetstream().delete_msg("EVENTS", seq)
        finally:
            await nc.close()

    asyncio.run(delete([seqs[3]]))  # e.g. max_msgs_per_subject or a single delete
    record = plan_ledger(storage_root, start_ns, end_ns, max_ranges=2, range_messages=10)
    assert record["total"] == 39 and record["deleted_in_range"] == 1
    assert record["first_seq"] == 1 and record["end_seq_exclusive"] == 41
    assert [(r["first_seq"], r["end_seq_exclusive"], r["count"]) for r in record["ranges"]] == [(1, 21, 19), (21, 41, 20)]
    assert sum(o["count"] for o in fetch_ranges(storage_root, record)) == 39

    asyncio.run(delete(seqs[10:14]))  # a purge in the middle of range 0
    with pytest.raises(FewerMessagesError, match=r"total: the stream now holds 35 messages of plgd.>, the ledger "
                                                 r"recorded 39"):
        plan_ledger(storage_root, start_ns, end_ns, max_ranges=2, range_messages=10)
    # a fetch that still uses the old ledger cannot account for its range either; range 1 still can
    with pytest.raises(LedgerError, match=r"range 0 \(sequences \[1, 21\)\): the stream holds 19 messages, "
                                          r"fetched 15"):
        fetch_ranges(storage_root, record)
    base = Layout.of(storage_root).ledger_interval_dir("EVENTS", record["interval_id"])
    assert run_op(ledger_range=1, ledger=base, storage_root=storage_root)["count"] == 20
