"""What a user of the ETL DAG sees and gets in Airflow 3, without Spark.

* The docs panel shows the user docs of ``dags/plgd_events_etl.py``; every param has a
  description and a type (event types list their allowed values); the DAG has a description and
  readable task names.
* A manual run whose data interval is not an interval of the schedule (the Trigger dialog's
  default logical date, now) is refused in its first task, before anything is read or written;
  the interval comes from the same code as ``POST /api/v2/dags/{dag_id}/dagRuns``
  (``TriggerDAGRunPostBody.validate_context`` on the serialized DAG), and the run itself goes
  through ``dag.test()`` (the same ``infer_manual_data_interval``) against a real nats-server.
* An interval for which the stream holds no message skips decode, dedupe and rebuild (no
  ``spark-submit``), and ``summary`` still reconciles 0 = 0; the staging asset event carries the
  interval's numbers; no event for the Spark datasets.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

from airflow_provider_plgd.tables.layout import Layout
from tests.integration.conftest import (
    load_connect_etl_dag,
    load_dag,
    publish_messages,
    read_stream,
    use_spark_connect,
    xcom_value,
)

pytestmark = pytest.mark.airflow

REPO = Path(__file__).resolve().parents[2]
UTC = timezone.utc
START = datetime(2026, 1, 1, tzinfo=UTC)
OWNER = "6a0e3a4b-1f33-4c67-9d7e-0f0f5a1b2c3d"


def asset_events(dag_run) -> dict[str, list[dict]]:
    """``{asset name: [extra, ...]}`` of the asset events a DAG run emitted (metadata DB)."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    out: dict[str, list[dict]] = {}
    with create_session() as session:
        for name, extra in session.execute(select(AssetModel.name, AssetEvent.extra).join(AssetEvent.asset)
                                           .where(AssetEvent.source_dag_id == dag_run.dag_id,
                                                  AssetEvent.source_run_id == dag_run.run_id)).all():
            out.setdefault(name, []).append(extra)
    return out


def _states(dag_run) -> dict[str, str]:
    return {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in dag_run.get_task_instances()
            if ti.map_index in (-1, 0)}


def test_docs_params_description_and_task_names():
    from airflow_provider_plgd.etl import DEFAULT_PARAMS
    from airflow_provider_plgd.plgd.event_types import EVENT_TYPES

    dag = load_dag(REPO / "dags" / "plgd_events_etl.py", "plgd_events_etl")
    assert dag.doc_md.startswith("# plgd_events_etl") and "`fetch_ranges`" in dag.doc_md
    assert "PLGD_ETL_START_DATE" in dag.doc_md and ":func:" not in dag.doc_md
    assert "JetStream" in dag.description and "Spark" in dag.description
    assert set(dag.params) == set(DEFAULT_PARAMS)
    for name, param in dag.params.items():
        schema = param.schema
        assert param.description and schema.get("type"), (name, param.description, schema)
        assert param.value == DEFAULT_PARAMS[name]
    assert dag.params.get_param("event_types").schema["items"]["enum"] == list(EVENT_TYPES)
    assert dag.params.get_param("event_types").schema["examples"] == list(EVENT_TYPES)
    assert "every owner" in dag.params.get_param("owners").description
    assert dag.params.get_param("settle_seconds").schema["minimum"] == 0
    names = {t.task_id: t.task_display_name for t in dag.tasks}
    assert set(names) == {"wait_for_interval", "plan", "fetch_ranges", "fetch", "spark_needed", "decode",
                          "dedupe", "rebuild", "summary"}
    assert all(names[i] != i for i in names), names  # readable names, stable task IDs
    # the sensor, fetch and Spark tasks carry their own docs (the task's "Task Docs" in the UI)
    from airflow_provider_plgd.etl import TASK_DOCS

    for task_id in ("wait_for_interval", "fetch", "decode", "dedupe", "rebuild"):
        assert dag.get_task(task_id).doc_md == TASK_DOCS[task_id] and "docs/" in TASK_DOCS[task_id], task_id
    # a value outside the allowed ones is refused, naming it, when a run is triggered
    from airflow.sdk.definitions.param import ParamValidationError

    with pytest.raises(ParamValidationError, match="notanevent"):
        dag.params.get_param("event_types").resolve(["notanevent"])
    # The Trigger form submits the defaults as they are, and a cleared optional field (null) too;
    # the form refuses an owner or stream that plan would refuse (JSON-schema patterns)
    dag.params.validate()
    for name in ("owners", "event_types", "storage_root", "spark_conf"):
        assert dag.params.get_param(name).resolve(None) is None, name
    for name, bad in (("owners", ["a/../b"]), ("owners", ["_unrouted"]), ("owners", ["a b"]), ("stream", "EV.X")):
        with pytest.raises(ParamValidationError):
            dag.params.get_param(name).resolve(bad)
    assert dag.params.get_param("owners").resolve(["6ba7b811-9dad-11d1-80b4-00c04fd430c8"])


def test_manual_trigger_with_the_dialogs_default_logical_date_is_refused(dags_folder, jetstream, tmp_path):
    """The Trigger dialog posts ``{"logical_date": now}``; the run's interval ends at now, off the grid."""
    from airflow.api_fastapi.core_api.datamodels.dag_run import TriggerDAGRunPostBody
    from airflow.serialization.serialized_objects import DagSerialization

    from airflow_provider_plgd.etl import OffScheduleIntervalError, build_etl_dag, require_data_interval

    root = tmp_path / "root"
    dag = build_etl_dag(dag_id="plgd_ux_manual", start_date=START, params={"settle_seconds": 0,
                                                                           "storage_root": str(root)})
    serialized = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    now = datetime(2026, 11, 23, 17, 14, 3, tzinfo=UTC)
    api = TriggerDAGRunPostBody(logical_date=now).validate_context(serialized)  # what the REST API does
    assert (api["data_interval"].start, api["data_interval"].end) == (now - timedelta(hours=1), now)

    run = SimpleNamespace(run_id="manual__x", run_type="manual", dag_id="plgd_ux_manual")
    context = {"data_interval_start": api["data_interval"].start, "data_interval_end": api["data_interval"].end,
               "logical_date": now, "dag_run": run}
    hook = dag.get_task("wait_for_interval").interval_check
    with pytest.raises(OffScheduleIntervalError) as info:
        hook(context)
    text = str(info.value)
    assert "[2026-11-23T16:00:00+00:00, 2026-11-23T17:00:00+00:00)" in text
    assert ("airflow backfill create --dag-id plgd_ux_manual \\\n    --from-date 2026-11-23T16:00:00+00:00 --to-date "
            "2026-11-23T16:00:00+00:00 \\\n    --reprocess-behavior completed") in text
    assert max(map(len, text.splitlines())) <= 100, text  # short lines: the task's log view does not wrap
    # a manual run of exactly one interval of the schedule (`airflow dags test <interval end>`) is accepted
    api = TriggerDAGRunPostBody(logical_date=datetime(2026, 11, 23, 17, tzinfo=UTC)).validate_context(serialized)
    grid = (datetime(2026, 11, 23, 16, tzinfo=UTC), datetime(2026, 11, 23, 17, tzinfo=UTC))
    assert (api["data_interval"].start, api["data_interval"].end) == grid
    assert hook({**context, "data_interval_start": grid[0], "data_interval_end": grid[1]}) == grid
    # scheduled and backfill runs are the timetable's own intervals: not checked
    off = {**context, "dag_run": SimpleNamespace(run_id="scheduled__x", run_type="scheduled")}
    assert require_data_interval(off, schedule=timedelta(hours=1), start_date=START)[1] == now
    # a cron schedule: its grid comes from the cron expression
    cron = {**context, "data_interval_start": datetime(2026, 11, 23, 16, 14, tzinfo=UTC)}
    with pytest.raises(OffScheduleIntervalError, match=r"\[2026-11-23T16:00:00\+00:00, 2026-11-23T17:00:00"):
        require_data_interval(cron, schedule="0 * * * *", start_date=START)

    # The run itself, created like the API's (infer_manual_data_interval of the logical date):
    # fails in wait_for_interval at once, without retries, and writes nothing.
    path = dags_folder / "plgd_ux_manual.py"
    path.write_text("from datetime import datetime, timezone\nfrom airflow_provider_plgd.etl import build_etl_dag\n"
                    f"dag = build_etl_dag(dag_id='plgd_ux_manual', start_date=datetime(2026, 1, 1, "
                    f"tzinfo=timezone.utc), params={{'settle_seconds': 0, 'storage_root': {str(root)!r}}})\n")
    dag = load_dag(path, "plgd_ux_manual")
    t0 = time.monotonic()
    dr = dag.test(logical_date=now)
    states = _states(dr)
    assert states["wait_for_interval"] == "failed" and states["plan"] == "upstream_failed", states
    assert time.monotonic() - t0 < 120
    assert not root.exists() or not any(root.rglob("*")), sorted(root.rglob("*"))


def test_empty_interval_skips_spark_and_reconciles_zero(dags_folder, jetstream, tmp_path):
    """An hour before the stream's first message: no Spark task runs, the ledger reconciles 0 = 0."""
    from airflow_provider_plgd import times
    from airflow_provider_plgd.tables import ledger

    root = tmp_path / "root"
    # one message now, so the owner is discovered from the stream's subjects; the run's interval is
    # the hour before it (a catch-up interval before the stream's first message)
    publish_messages(jetstream.url, [(f"plgd.owners.{OWNER}.devices.d1.resource-links.resourcelinkspublished",
                                      b"x", {"Nats-Msg-Id": "m1"})])
    end = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    start = end - timedelta(hours=1)
    path = dags_folder / "plgd_ux_empty.py"
    path.write_text("from datetime import datetime, timezone\nfrom airflow_provider_plgd.etl import build_etl_dag\n"
                    f"dag = build_etl_dag(dag_id='plgd_ux_empty', start_date=datetime(2026, 1, 1, "
                    f"tzinfo=timezone.utc), params={{'settle_seconds': 0, 'storage_root': {str(root)!r}}})\n")
    dag = load_dag(path, "plgd_ux_empty")
    t0 = time.monotonic()
    dr = dag.test(logical_date=end)  # a manual run of the schedule's interval [end - 1 h, end)
    seconds = time.monotonic() - t0
    states = _states(dr)
    assert states == {"wait_for_interval": "success", "plan": "success", "fetch_ranges": "success",
                      "fetch": "success", "spark_needed": "success", "decode": "skipped", "dedupe": "skipped",
                      "rebuild": "skipped", "summary": "success"}, states
    assert seconds < 120, seconds
    interval = times.interval_id(start, end)
    planned = xcom_value(dr, "plan")
    assert planned["messages"] == 0 and planned["owners"] == "all" and len(planned["fetch_ranges"]) == 1
    assert "no snapshot yet" in planned["spark_skip"]
    result = xcom_value(dr, "summary")
    assert result["reconciled"] is True and result["problems"] == []
    assert result["chain"]["stream_total"] == 0 and result["chain"]["staged"] == 0
    assert result["chain"]["decoded"] == 0 and result["chain"]["kept"] == 0
    assert result["chain"]["spark_skipped"] == planned["spark_skip"]
    written = ledger.read_ledger_file(f"{Layout.of(str(root)).ledger_interval_dir('EVENTS', interval)}/summary.json")
    assert written["reconciled"] is True
    for table in ("events", "quarantine", "events_deduped", "msgid_index", "snapshots", "_runs"):
        assert not (root / table).exists(), table  # no Spark output, no snapshot version

    # The "Tables" link: a local root has none (a file:// URL does not open from a browser); the
    # summary task pushed nothing for it, and Airflow 3 stored the link's empty value when it ended.
    assert xcom_value(dr, "summary", "plgd_tables") is None
    assert xcom_value(dr, "summary", "_link_PlgdTablesLink") == ""

    # Asset events: one staging event with the interval's numbers; none for the Spark datasets.
    assert asset_events(dr) == {"plgd_ux_empty.staging": [{"interval_id": interval, "messages": 0, "owners": "all", "fetch_ranges": 1}]}
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session

    from airflow_provider_plgd.compat import ASSET_EVENT_PARTITIONS

    if ASSET_EVENT_PARTITIONS:  # Airflow >= 3.3: the event is the interval's partition
        with create_session() as session:
            keys = session.query(AssetEvent.partition_key).filter(AssetEvent.source_run_id == dr.run_id).all()
        assert [k[0] for k in keys] == [interval]


def test_spark_skip_reason_needs_no_message_no_outputs_and_no_expiring_pending(tmp_path):
    from airflow_provider_plgd.etl import spark_skip_reason
    from tests.integration.test_example_dags import write_snapshot

    root = tmp_path / "root"
    end = datetime(2026, 1, 1, 2, tzinfo=UTC)
    record = {"total": 0, "interval_id": "20260101T010000Z_20260101T020000Z"}
    assert "no snapshot yet" in spark_skip_reason(Layout.of(str(root)), record, end)
    assert spark_skip_reason(Layout.of(str(root)), {**record, "total": 3}, end) is None

    write_snapshot(root, {"owner_devices": []}, int(datetime(2026, 1, 1, 1, tzinfo=UTC).timestamp()) * 10**9,
                   "20260101T000000Z_20260101T010000Z")
    assert "no pending of snapshot" in spark_skip_reason(Layout.of(str(root)), record, end)
    # a pending that expires within the interval: rebuild must run (it drops the expired pending)
    snapshot_ns = int(datetime(2026, 1, 1, 1, tzinfo=UTC).timestamp()) * 10**9
    write_snapshot(root, {"owner_devices": []}, snapshot_ns, "20260101T000000Z_20260101T010000Z",
                   next_expiry_ns={"0": int(datetime(2026, 1, 1, 1, 30, tzinfo=UTC).timestamp()) * 10**9})
    assert spark_skip_reason(Layout.of(str(root)), record, end) is None
    write_snapshot(root, {"owner_devices": []}, snapshot_ns, "20260101T000000Z_20260101T010000Z",
                   next_expiry_ns={"0": int(end.timestamp()) * 10**9})  # expires at the end: next interval's job
    assert spark_skip_reason(Layout.of(str(root)), record, end) is not None
    # an earlier run of the interval wrote outputs: a rerun replaces them with Spark
    summary = Path(Layout.of(str(root)).run_summary("decode", record["interval_id"]))
    summary.parent.mkdir(parents=True)
    summary.write_text("{}")
    assert spark_skip_reason(Layout.of(str(root)), record, end) is None
    shutil.rmtree(root)


# The chain's DAG runs its Spark tasks on the session's Spark Connect server: this test proves the
# chain (lookback, snapshot parent, rerun), not ``spark-submit`` (docs/testing.md).
@pytest.mark.spark
def test_a_skipped_empty_interval_keeps_the_dedupe_lookback_and_the_snapshot_chain(
        jetstream, dags_folder, storage_root, spark_connect_server, monkeypatch):
    """Interval 0 with messages, interval 1 empty (skipped), interval 2 with messages that repeat
    some of interval 0's: dedupe of 2 still drops them (its lookback reaches across the skipped
    interval), and rebuild of 2 builds on the snapshot of 0: the final snapshot is the simulator's truth."""
    from airflow_provider_plgd import times
    from airflow_provider_plgd.simulator import SimulationConfig, expected_state, generate, publish
    from airflow_provider_plgd.tables import snapshot_store
    from airflow_provider_plgd.tables.run_summary import read_app_summary
    from plgd_devtools.ground_truth import GroundTruth
    from plgd_devtools.snapshot_compare import compare_snapshot
    from plgd_devtools.spark import spark_lock

    use_spark_connect(monkeypatch, spark_connect_server)
    step = 8
    dag = load_connect_etl_dag(dags_folder, "plgd_ux_chain", step)
    # The simulator's intervals are two ETL intervals long and each is published at its start, so
    # ETL intervals 0 and 2 hold its messages and interval 1 (and 3) none.
    start_s = (int(time.time() // (2 * step)) + 1) * 2 * step
    sim = generate(SimulationConfig(seed=21, owners=2, devices_per_owner=2, resources_per_device=2, intervals=2,
                                    steps_per_interval=20, interval_seconds=2 * step,
                                    start_time_ns=int(start_s * 1e9), duplicates=0.1))
    published = publish(sim, servers=[jetstream.url], stream="EVENTS", wait_for_intervals=True)
    truth = GroundTruth.of(sim, published).summary()
    stored = read_stream(jetstream.url)
    in_interval = Counter(int((t / 1e9 - start_s) // step) for _s, t, _h, _d in stored.values())
    assert set(in_interval) == {0, 2}, in_interval  # publishing took less than one ETL interval
    assert truth["duplicates"]["total"] > 0

    ends = [datetime.fromtimestamp(start_s + step * (k + 1), tz=UTC) for k in range(3)]
    time.sleep(max(0.0, ends[-1].timestamp() + 0.5 - time.time()))
    runs = []
    with spark_lock():
        for end in ends:
            dr = dag.test(logical_date=end, run_conf={"storage_root": storage_root, "settle_seconds": 0})
            assert "success" in str(dr.state).lower(), (end, dr.state, _states(dr))
            runs.append(dr)
    ids = [times.interval_id(e - timedelta(seconds=step), e) for e in ends]
    # interval 1: skipped unless a pending of interval 0's snapshot expires in it (then Spark must run)
    skipped = _states(runs[1])["decode"] == "skipped"
    v0 = snapshot_store.snapshot(Layout.of(storage_root), snapshot_store.version_id(int(ends[0].timestamp()) * 10**9))
    due = any(ns is not None and int(ns) < int(ends[1].timestamp()) * 10**9
              for ns in (v0.get("next_expiry_ns") or {}).values())
    assert skipped == (not due), (skipped, v0.get("next_expiry_ns"))
    print(f"[chain] interval 1 skipped: {skipped} (pending expiring in it: {due})")
    if skipped:
        assert {t: s for t, s in _states(runs[1]).items() if t in ("decode", "dedupe", "rebuild")} == \
            {"decode": "skipped", "dedupe": "skipped", "rebuild": "skipped"}
        assert read_app_summary(Layout.of(storage_root), "dedupe", ids[1]) is None
        assert "no pending of snapshot" in xcom_value(runs[1], "plan")["spark_skip"]
    assert xcom_value(runs[1], "summary")["reconciled"] is True
    assert xcom_value(runs[1], "summary")["chain"]["stream_total"] == 0
    # interval 2: dedupe looked back at interval 0 and dropped the repeats of its messages
    dedupe = [read_app_summary(Layout.of(storage_root), "dedupe", i) for i in (ids[0], ids[2])]
    assert sum(d["duplicates"] for d in dedupe) == truth["duplicates"]["total"]
    assert dedupe[1]["cross_batch_duplicates"] > 0
    assert ids[0] in dedupe[1]["previous_intervals"]
    # rebuild of interval 2 built on interval 0's snapshot (or 1's, when 1 ran), and equals the truth
    latest = snapshot_store.latest(Layout.of(storage_root))
    assert latest["interval_id"] == ids[2]
    parent = snapshot_store.snapshot(Layout.of(storage_root), latest["parent"])
    assert parent["interval_id"] == (ids[0] if skipped else ids[1])
    assert compare_snapshot(storage_root, expected_state(sim, through_interval=1)) == []
    for dr in runs:
        assert xcom_value(dr, "summary")["reconciled"] is True

    # Clear and rerun the first interval (docs/reliability.md, "Reruns of old intervals"): its
    # snapshot is not rebuilt on top of the later ones (the old code failed here: "the latest snapshot
    # is newer"), the latest snapshot stays the latest and the truth, no event is counted twice, and
    # dedupe's "seen before" of interval 2 still holds.
    def deduped_ids(interval: str) -> list[str]:
        from tests.integration.delta_read import read_both

        return sorted(r["msg_id"] for r in read_both(f"{storage_root}/events_deduped", "msg_id", interval_id=interval))

    before = {i: deduped_ids(i) for i in (ids[0], ids[2])}
    latest_before = snapshot_store.latest(Layout.of(storage_root))
    with spark_lock():
        rerun = dag.test(logical_date=ends[0], run_conf={"storage_root": storage_root, "settle_seconds": 0})
    assert "success" in str(rerun.state).lower(), _states(rerun)
    rebuilt = read_app_summary(Layout.of(storage_root), "rebuild", ids[0])
    assert rebuilt["unchanged"] is True and rebuilt["latest"] == latest_before["version"] and rebuilt["events"] == 0
    latest = snapshot_store.latest(Layout.of(storage_root))
    assert (latest["version"], latest["interval_id"]) == (latest_before["version"], ids[2])  # not back in time
    assert {i: deduped_ids(i) for i in (ids[0], ids[2])} == before
    assert not set(before[ids[0]]) & set(before[ids[2]])  # no message ID kept in two intervals
    assert compare_snapshot(storage_root, expected_state(sim, through_interval=1)) == []
    assert xcom_value(rerun, "summary")["reconciled"] is True


def test_a_hole_before_the_interval_fails_plan_naming_it(dags_folder, jetstream, tmp_path):
    """Three empty hourly intervals A, B, C (no Spark): A runs; C, with B never run, fails in
    ``plan`` with ``IntervalGapError`` naming B's hour and the backfill, and writes no ledger of its
    own; B, then C, run. What a backfill of a later interval leaves behind (docs/operations.md,
    "Holes in the interval chain"), through ``dag.test()`` (a scheduler would add minutes)."""
    from airflow_provider_plgd import times

    root = tmp_path / "root"
    path = dags_folder / "plgd_ux_gap.py"
    path.write_text("from datetime import datetime, timezone\nfrom airflow_provider_plgd.etl import build_etl_dag\n"
                    f"dag = build_etl_dag(dag_id='plgd_ux_gap', start_date=datetime(2026, 1, 1, "
                    f"tzinfo=timezone.utc), default_args={{'retries': 0}}, "
                    f"params={{'settle_seconds': 0, 'storage_root': {str(root)!r}}})\n")
    dag = load_dag(path, "plgd_ux_gap")
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    a, b, c = (hour - timedelta(hours=k) for k in (2, 1, 0))  # interval ends
    t0 = time.monotonic()
    assert _states(dag.test(logical_date=a))["summary"] == "success"
    dr = dag.test(logical_date=c)
    states = _states(dr)
    assert states["plan"] == "failed" and states["summary"] == "upstream_failed", states
    c_id = times.interval_id(b, c)
    assert not (Path(Layout.of(str(root)).ledger_interval_dir("EVENTS", c_id)) / "stream.json").exists()  # nothing written
    from airflow.models import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        ti = session.query(TaskInstance).filter_by(dag_id=dr.dag_id, run_id=dr.run_id, task_id="plan").one()
        assert ti.try_number == 1  # retries=0 here; the DAG's default retries it twice
    assert _states(dag.test(logical_date=b))["summary"] == "success"
    dr = dag.test(logical_date=c, run_conf={"max_fetch_tasks": 3})
    assert _states(dr)["summary"] == "success"
    # the summary names the params the run used (the DAG's defaults with the run's conf)
    assert xcom_value(dr, "summary")["params"] == {
        "storage_root": str(root), "stream": "EVENTS", "settle_seconds": 0, "max_fetch_tasks": 3,
        "lookback_intervals": 24, "accept_fewer_messages": False, "max_content_bytes": 4 * 1024 * 1024,
        "spark_conf": {}}
    print(f"[gap] 4 runs in {time.monotonic() - t0:.1f} s")
