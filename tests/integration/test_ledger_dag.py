"""The interval ledger through the whole ETL DAG (case 1 of ``docs/reliability.md``, "The interval
ledger"): unknown event types, malformed, unrouted subjects and old-hub snapshots reach quarantine
or events and the ledger adds up. Real nats-server (``jetstream`` fixture), real Airflow
``dag.test()`` with its Spark tasks on the session's real Spark Connect server (it proves the
ledger, not ``spark-submit``; docs/testing.md). Failed on the code before the ledger.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from airflow_provider_plgd import times
from airflow_provider_plgd.tables.layout import Layout
from tests.integration.conftest import load_connect_etl_dag, publish_messages, read_stream, use_spark_connect
from tests.integration.ledger_runs import DEV, HREF, UTC

# ---------------------------------------------------------------------------------------------
# Case 1: unknown event types, malformed subjects, unrouted subjects and old-hub snapshots,
# through the whole ETL DAG (real Airflow, real Spark Connect server)
# ---------------------------------------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.airflow
def test_unknown_types_bad_and_unrouted_subjects_reach_quarantine_and_the_ledger_adds_up(
        jetstream, dags_folder, storage_root, spark_connect_server, monkeypatch):
    from airflow_provider_plgd.simulator import SimulationConfig, expected_state, generate, publish
    from plgd_devtools.snapshot_compare import compare_snapshot
    from plgd_devtools.spark import spark_lock

    use_spark_connect(monkeypatch, spark_connect_server)
    interval = 8
    dag = load_connect_etl_dag(dags_folder, "plgd_test_ledger_etl", interval)

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
