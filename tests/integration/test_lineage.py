"""OpenLineage events of the ETL DAG (``airflow_provider_plgd.operators.lineage``, ``docs/lineage.md``).

The first tests check the dataset names without Airflow. The last one runs the ETL DAG with
``dag.test()`` against a real nats-server and real ``spark-submit``, with the OpenLineage
provider's listener and a file transport, then reads the emitted events: each stage's input and
output datasets, and the parent run of the Spark stages (the DAG run in their events; the task's
own run in the ``spark.openlineage.parent*`` settings handed to ``spark-submit``).
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

pytest.importorskip("airflow.providers.openlineage")

from airflow_provider_plgd.operators import lineage
from tests.integration.conftest import load_dag, read_stream, use_local_spark

UTC = timezone.utc


# ---------------------------------------------------------------------------------------------
# Names (no Airflow run)
# ---------------------------------------------------------------------------------------------
def test_nats_namespace_is_the_first_server_in_sorted_order_without_credentials_or_transport():
    assert lineage.nats_namespace(["nats://10.0.0.2:4222", "tls://10.0.0.1:4333"]) == "nats://10.0.0.1:4333"
    assert lineage.nats_namespace(["wss://nats.example.com"]) == "nats://nats.example.com:4222"
    assert lineage.nats_namespace(["nats://[::1]:4222"]) == "nats://[::1]:4222"
    with pytest.raises(ValueError, match="no host"):
        lineage.nats_namespace(["nats://:4222"])
    with pytest.raises(ValueError, match="no NATS servers"):
        lineage.nats_namespace([])


def test_storage_locations_follow_the_openlineage_file_naming():
    assert lineage.storage_location("/data/plgd", "events") == ("file", "/data/plgd/events")
    assert lineage.storage_location("file:///data/plgd/", "staging", "EVENTS") == ("file", "/data/plgd/staging/EVENTS")
    assert lineage.storage_location("s3a://bucket/plgd", "events_deduped") == ("s3://bucket", "plgd/events_deduped")
    assert lineage.storage_location("s3://bucket", "snapshots") == ("s3://bucket", "snapshots")
    assert lineage.storage_location("gcs://b/r", "quarantine") == ("gs://b", "r/quarantine")
    assert lineage.storage_location("hdfs://nn:8020/plgd", "events") == ("hdfs://nn:8020", "plgd/events")
    with pytest.raises(ValueError, match="empty storage root"):
        lineage.storage_location("", "events")


def test_spark_app_lineage_from_the_applications_arguments():
    decode = lineage.spark_app_lineage("/x/spark_apps/decode_events.py", [
        "--root", "s3a://b/r", "--stream", "EVENTS", "--interval-id", "i",
        "--ledger", "--max-content-bytes", "10"])
    assert [(d.namespace, d.name) for d in decode.inputs] == [("s3://b", "r/staging/EVENTS")]
    assert [(d.namespace, d.name) for d in decode.outputs] == [("s3://b", "r/events"), ("s3://b", "r/quarantine")]
    rebuild = lineage.spark_app_lineage("rebuild_snapshots.py", ["--root", "/r", "--interval-id", "i"])
    snapshots = [f"/r/snapshots/{t}" for t in ("resources", "device_metadata", "device_links", "owner_devices")]
    assert [d.name for d in rebuild.inputs] == ["/r/events_deduped", *snapshots]
    assert [d.name for d in rebuild.outputs] == snapshots
    assert lineage.spark_app_lineage("other_app.py", []) is None
    assert lineage.spark_app_lineage("dedupe_events.py", ["--root", "{{ ti.xcom_pull('plan') }}"]) is None
    with pytest.raises(ValueError, match="--root"):
        lineage.spark_app_lineage("dedupe_events.py", ["--interval-id", "i"])


def test_fetch_subject_filters_owner_wide_and_per_target():
    o1, o2 = "6ba7b811-9dad-11d1-80b4-00c04fd430c8", "e1407479-3136-56c0-9908-bb02fb0339e2"
    targets = [(o1, "resourcechanged", ["a", "b"]), (o1, "_unknown", ["plgd.owners." + o1 + ".>"]),
               (o2, "resourcechanged", ["c"])]
    assert lineage.fetch_subject_filters(targets, owner_wide=True) == [f"plgd.owners.{o1}.>", f"plgd.owners.{o2}.>"]
    assert lineage.fetch_subject_filters([("_unrouted", "_unknown", ["plgd.>"])], owner_wide=True) == ["plgd.>"]
    assert lineage.fetch_subject_filters(targets[:1], owner_wide=False) == ["a", "b"]
    facet = lineage.stream_dataset(["nats://h:1"], "EVENTS", [f"s{i}" for i in range(150)]).inputFacets["natsSubjects"]
    assert facet.subjectFilterCount == 150 and len(facet.subjectFilters) == lineage.MAX_SUBJECT_FILTERS


def test_disabled_openlineage_adds_nothing_to_the_spark_tasks(monkeypatch):
    """Without a transport the provider is disabled: no parent-run settings, no lineage on @tasks."""
    for key in ("AIRFLOW__OPENLINEAGE__TRANSPORT", "OPENLINEAGE_URL", "OPENLINEAGE_CONFIG",
                "AIRFLOW__OPENLINEAGE__CONFIG_PATH"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__DISABLED", "True")
    assert lineage.is_enabled() is False
    assert lineage.spark_submit_kwargs() == {}

    class Task:
        pass

    task = Task()
    lineage.report_task_lineage({"task": task}, lambda: pytest.fail("built while disabled"))
    assert not hasattr(task, "get_openlineage_facets_on_complete")


# ---------------------------------------------------------------------------------------------
# A real run of the ETL DAG with the OpenLineage listener
# ---------------------------------------------------------------------------------------------
ETL_DAG_FILE = """
import tempfile
from datetime import datetime, timedelta, timezone
from airflow_provider_plgd.etl import build_etl_dag
from plgd_devtools.spark import FAST_LOCAL_SPARK_CONF

dag = build_etl_dag(dag_id="plgd_test_lineage_etl", schedule=timedelta(seconds=INTERVAL),
                    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc), catchup=False,
                    spark_conf=FAST_LOCAL_SPARK_CONF, default_args={"retries": 0},
                    storage_roots=[tempfile.gettempdir()])  # runs choose their root below it
"""
DAG_ID = "plgd_test_lineage_etl"


@pytest.fixture
def openlineage_file_transport(tmp_path, monkeypatch):
    """The OpenLineage listener on the task and DAG-run listener managers, writing JSON lines to a file.

    The provider registers its listener through its plugin when the plugin is loaded with a
    transport configured; the suite loads plugins without one (OpenLineage off for every other
    test), so the listener is added here and removed afterwards. Task events are emitted in a
    thread (``execute_in_thread``); DAG-run events in the listener's process pool, shut down here.
    """
    from airflow.listeners.listener import get_listener_manager as core_listeners
    from airflow.providers.openlineage.plugins.listener import get_openlineage_listener
    from airflow.sdk.listener import get_listener_manager as task_listeners

    path = tmp_path / "openlineage.jsonl"
    monkeypatch.delenv("AIRFLOW__OPENLINEAGE__DISABLED", raising=False)
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__TRANSPORT",
                       json.dumps({"type": "file", "log_file_path": str(path), "append": True}))
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__EXECUTE_IN_THREAD", "True")
    listener = get_openlineage_listener()
    listener.adapter._client = None  # a client built earlier would carry another transport
    managers = [m for m in (task_listeners(), core_listeners()) if not m.pm.is_registered(listener)]
    for manager in managers:
        manager.add_listener(listener)
    try:
        yield path
    finally:
        for manager in managers:
            manager.pm.unregister(listener)
        listener.adapter._client = None
        # DAG-run events go through the listener's process pool: its forked worker inherited the
        # open Spark lock (flock), so it must end with the test, or the next Spark test waits forever.
        executor, listener._executor = listener._executor, None
        if executor is not None:
            executor.shutdown(wait=True)


def _events(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _names(datasets: list[dict]) -> list[tuple[str, str]]:
    return sorted((d["namespace"], d["name"]) for d in datasets)


@pytest.mark.spark
@pytest.mark.airflow
def test_etl_run_emits_each_stages_datasets_and_the_spark_stages_parent_run(
        jetstream, dags_folder, storage_root, monkeypatch, openlineage_file_transport):
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from airflow_provider_plgd.simulator import SimulationConfig, generate, publish
    from plgd_devtools.spark import spark_lock

    use_local_spark(monkeypatch)
    commands: list[list[str]] = []  # a spy: every spark-submit command line, the real command still runs
    build = SparkSubmitHook._build_spark_submit_command

    def spy(self, application):
        command = build(self, application)
        commands.append(list(command))
        return command

    monkeypatch.setattr(SparkSubmitHook, "_build_spark_submit_command", spy)

    interval = 8
    path = dags_folder / f"{DAG_ID}.py"
    path.write_text(ETL_DAG_FILE.replace("INTERVAL", str(interval)))
    dag = load_dag(path, DAG_ID)
    start_s = (int(time.time() // interval) + 1) * interval
    sim = generate(SimulationConfig(seed=5, owners=2, devices_per_owner=1, resources_per_device=1, intervals=1,
                                    steps_per_interval=10, interval_seconds=interval,
                                    start_time_ns=int(start_s * 1e9)))
    publish(sim, servers=[jetstream.url], stream="EVENTS", wait_for_intervals=True)
    truth = read_stream(jetstream.url)
    owners = sorted({subject.split(".")[2] for subject, _t, _h, _d in truth.values()})
    assert len(owners) == 2
    end_s = start_s + interval
    time.sleep(max(0.0, end_s + 0.5 - time.time()))
    end = datetime.fromtimestamp(end_s, tz=UTC)
    t0 = time.monotonic()
    with spark_lock():
        dr = dag.test(logical_date=end, run_conf={"storage_root": storage_root, "settle_seconds": 0})
    assert "success" in str(dr.state).lower(), dr.state
    print(f"dag.test with OpenLineage: {time.monotonic() - t0:.1f} s")

    events = _events(openlineage_file_transport)
    complete = {}
    for event in events:
        if event["eventType"] == "COMPLETE" and event["job"]["name"].startswith(f"{DAG_ID}."):
            complete.setdefault(event["job"]["name"].split(".", 1)[1], []).append(event)
    assert set(complete) >= {"plan", "fetch", "decode", "dedupe", "rebuild", "summary"}, sorted(complete)
    namespace = complete["plan"][0]["job"]["namespace"]  # [openlineage] namespace (here the default)
    assert all(e["job"]["namespace"] == namespace for es in complete.values() for e in es)

    nats = f"nats://{jetstream.host}:{jetstream.port}"
    root = storage_root

    def one(task_id: str) -> dict:
        assert len(complete[task_id]) == 1, complete[task_id]
        return complete[task_id][0]

    plan = one("plan")
    assert _names(plan["inputs"]) == [(nats, "EVENTS")]
    assert plan["inputs"][0]["inputFacets"]["natsSubjects"]["subjectFilters"] == ["plgd.>"]
    assert _names(plan["outputs"]) == [("file", f"{root}/_ledger/EVENTS")]

    fetched_filters = set()
    for event in complete["fetch"]:  # one per mapped fetch task (sequence range)
        assert _names(event["inputs"]) == [(nats, "EVENTS")]
        facet = event["inputs"][0]["inputFacets"]["natsSubjects"]
        assert facet["subjectFilterCount"] == len(facet["subjectFilters"])
        fetched_filters |= set(facet["subjectFilters"])
        assert _names(event["outputs"]) == [("file", f"{root}/staging/EVENTS")]
    assert fetched_filters == {"plgd.>"}  # every owner: each range is read with one plgd.> consumer

    decode = one("decode")
    assert _names(decode["inputs"]) == [("file", f"{root}/staging/EVENTS")]
    assert _names(decode["outputs"]) == [("file", f"{root}/events"), ("file", f"{root}/quarantine")]
    dedupe = one("dedupe")
    assert _names(dedupe["inputs"]) == [("file", f"{root}/events"), ("file", f"{root}/msgid_index")]
    assert _names(dedupe["outputs"]) == [("file", f"{root}/events_deduped"), ("file", f"{root}/msgid_index")]
    rebuild = one("rebuild")
    snapshots = sorted(("file", f"{root}/snapshots/{t}") for t in ("resources", "device_metadata", "device_links",
                                                                     "owner_devices"))
    assert _names(rebuild["inputs"]) == sorted([("file", f"{root}/events_deduped"), *snapshots])
    assert _names(rebuild["outputs"]) == snapshots
    summary = one("summary")
    assert _names(summary["inputs"]) == [("file", f"{root}/_ledger/EVENTS"), ("file", f"{root}/_runs")]
    assert _names(summary["outputs"]) == [("file", f"{root}/_ledger/EVENTS")]

    # the datasets are Delta tables where the names say (the names are not made up)
    for name in ["events", "quarantine", "events_deduped"] + [f"snapshots/{t}" for t in (
            "resources", "device_metadata", "device_links", "owner_devices")]:
        assert (Path(root) / name / "_delta_log" / "00000000000000000000.json").is_file(), name

    # the Spark stages' parent: the DAG run in their own events ...
    from airflow.providers.openlineage.plugins.adapter import OpenLineageAdapter

    # the provider's run ID of this DAG run (its own DAG-run events are emitted asynchronously)
    dag_run_id = OpenLineageAdapter.build_dag_run_id(dag_id=DAG_ID, logical_date=dr.logical_date,
                                                     clear_number=dr.clear_number)
    parents = set()
    for task_id in ("decode", "dedupe", "rebuild"):
        parent = one(task_id)["run"]["facets"]["parent"]
        assert (parent["job"]["namespace"], parent["job"]["name"]) == (namespace, DAG_ID)
        parents.add(parent["run"]["runId"])
    assert len(parents) == 1
    assert parents == {dag_run_id}
    # ... and each task's run handed to its Spark application as the application's parent
    assert len(commands) == 3, commands
    for task_id, command in zip(("decode", "dedupe", "rebuild"), commands, strict=True):
        conf = dict(arg.split("=", 1) for arg in command if arg.startswith("spark.openlineage."))
        assert conf["spark.openlineage.parentJobNamespace"] == namespace
        assert conf["spark.openlineage.parentJobName"] == f"{DAG_ID}.{task_id}"
        assert conf["spark.openlineage.parentRunId"] == one(task_id)["run"]["runId"]
        assert conf["spark.openlineage.rootParentJobName"] == DAG_ID
        assert conf["spark.openlineage.rootParentRunId"] in parents
