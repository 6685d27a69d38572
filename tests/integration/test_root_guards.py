"""Guards that check the data, round 5 ("No silent loss"): storage roots that cannot overlap, an
atomic identity record, and a recorded identity that binds every run on its root.

Real nats-server, real Airflow ``dag.test()`` with run conf (each DAG run's tasks in this process),
real ``spark-submit`` in local mode where the Spark applications run, tables read with
``deltalake`` and ``polars``; the S3 cases on the suite's moto server.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from airflow_provider_plgd.plgd.subjects import registrations_subject
from tests.integration.conftest import load_test_dag, publish_messages, use_spark_connect

pytestmark = pytest.mark.airflow

UTC = timezone.utc
OWNER = "6ba7b811-9dad-11d1-80b4-00c04fd430c8"
INTERVAL = 4
DAG_FILE = """
from datetime import datetime, timedelta, timezone
from airflow_provider_plgd.etl import build_etl_dag
from plgd_devtools.spark import FAST_LOCAL_SPARK_CONF

dag = build_etl_dag(dag_id="DAG_ID", schedule=timedelta(seconds=INTERVAL),
                    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc), catchup=False,
                    SPARK_ARGS, default_args={"retries": 0},
                    params={"settle_seconds": 0, "storage_root": ROOT}, storage_roots=VIEWS)
"""


def etl_dag(dags_folder, name: str, root, views=(), *, connect: bool = False) -> object:
    """The ETL DAG ``name`` on ``root``; ``connect``: its Spark tasks on the session's Spark Connect
    server (``use_spark_connect``), else ``spark-submit`` with ``FAST_LOCAL_SPARK_CONF``."""
    spark = ('spark_connect_conn_id="plgd_spark_connect_test"' if connect
             else "spark_conf=FAST_LOCAL_SPARK_CONF")
    text = (DAG_FILE.replace("SPARK_ARGS", spark).replace("DAG_ID", name).replace("INTERVAL", str(INTERVAL))
            .replace("ROOT", repr(str(root))).replace("VIEWS", repr([str(v) for v in views])))
    return load_test_dag(dags_folder, name, text, name)


def states(dag_run) -> dict[str, str]:
    return {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in dag_run.get_task_instances()
            if ti.map_index in (-1, 0)}


class Intervals:
    """Consecutive past intervals of the test schedule (the chain's gap check needs them in order)."""

    def __init__(self, count: int) -> None:
        self.first = int(time.time() // INTERVAL) - count - 1

    def end(self, index: int) -> datetime:
        return datetime.fromtimestamp((self.first + index) * INTERVAL, tz=UTC)


def files_below(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


# ---------------------------------------------------------------------------------------------
# 1. a folder name stands in for a table
# ---------------------------------------------------------------------------------------------

def test_a_run_root_inside_the_dags_own_root_is_refused_and_the_author_pipeline_goes_on(jetstream, dags_folder,
                                                                                       tmp_path, capfd):
    """A trigger-only user picks ``{root}/events/interval=x`` (a folder below the DAG's own root,
    which the root allows) with a narrower owner selection. Before: the run wrote its ledger and
    staging inside the pipeline's ``events`` folder, and from then on every ``plan`` of the DAG's own
    root failed with OldLayoutError. Now it fails in its first task, nothing is written, and the
    DAG's own run goes on."""
    root = tmp_path / "lake"
    dag = etl_dag(dags_folder, "plgd_test_guard_inside", root)
    intervals = Intervals(2)
    inside = root / "events" / "interval=x"
    dr = dag.test(logical_date=intervals.end(0), run_conf={"storage_root": str(inside), "owners": [OWNER]})
    logged = "".join(capfd.readouterr())
    got = states(dr)
    assert got["wait_for_interval"] == "failed" and got["plan"] == "upstream_failed", got
    assert f"StorageRootOverlapError: the storage root '{inside}' overlaps another one: it lies inside " \
           f"'{root}', a root this DAG writes" in logged, logged[-3000:]
    assert files_below(root) == []

    dr = dag.test(logical_date=intervals.end(1))  # the DAG's own run, every owner
    got = states(dr)
    assert got["plan"] == "success" and got["summary"] == "success", got
    assert json.loads((root / "_ledger" / "pipeline.json").read_text())["owners"] is None


@pytest.mark.spark
def test_a_folder_named_like_the_old_layout_stops_neither_plan_nor_the_spark_applications(
        jetstream, dags_folder, spark_connect_server, tmp_path, monkeypatch):
    """``{root}/events/interval=x``, a folder anybody could make (an earlier version's triggered run
    left one): before, ``plan`` and each Spark application took it for the layout before Delta Lake
    (OldLayoutError). The old layout is known by its records (``_manifest.json``), not by a name.
    The Spark applications run on the session's Spark Connect server (their checks run in the
    client, the same code as in a ``spark-submit`` driver; docs/testing.md)."""
    from plgd_devtools.spark import spark_lock
    from tests.integration.delta_read import read_both

    use_spark_connect(monkeypatch, spark_connect_server)
    root = tmp_path / "lake"
    (root / "events" / "interval=x").mkdir(parents=True)
    (root / "events" / "interval=x" / "notes.txt").write_text("a user's file")
    dag = etl_dag(dags_folder, "plgd_test_guard_oldname", root, connect=True)
    start_s = (int(time.time() // INTERVAL) + 1) * INTERVAL
    time.sleep(max(0.0, start_s + 0.05 - time.time()))
    publish_messages(jetstream.url, [(registrations_subject(OWNER, "devicesregistered"), b"x", None)])
    time.sleep(max(0.0, start_s + INTERVAL + 0.3 - time.time()))
    with spark_lock():
        dr = dag.test(logical_date=datetime.fromtimestamp(start_s + INTERVAL, tz=UTC))
    got = states(dr)
    assert all(got[t] == "success" for t in ("plan", "fetch", "decode", "dedupe", "rebuild", "summary")), got
    # the message is in the tables (an undecodable payload: quarantined with its reason), read with deltalake and polars
    rows = read_both(str(root / "quarantine"), "stream_seq")
    assert [r["stream_seq"] for r in rows] == [1], rows


@pytest.mark.parametrize("where", ["inside", "above", "table"])
def test_a_run_root_inside_or_above_a_recorded_pipeline_or_a_table_is_refused_before_any_write(
        jetstream, dags_folder, tmp_path, capfd, where):
    """Roots below an allowed one (``storage_roots``): a run at ``views/a`` records its pipeline
    there; a later run inside it (``views/a/b``), above it (``views``) or inside a Delta table made by
    another writer (``views/t/x``) is refused in ``plan``, by the records found (the Delta log, the
    identity), before anything is written."""
    import pyarrow as pa
    from deltalake import write_deltalake

    lake, views = tmp_path / "lake", tmp_path / "views"
    dag = etl_dag(dags_folder, f"plgd_test_guard_{where}", lake, [views])
    intervals = Intervals(2)
    first = views / "a"
    dr = dag.test(logical_date=intervals.end(0), run_conf={"storage_root": str(first), "owners": [OWNER]})
    assert states(dr)["summary"] == "success", states(dr)
    write_deltalake(str(views / "t"), pa.table({"n": [1, 2]}))
    before = files_below(views)
    target = {"inside": first / "b", "above": views, "table": views / "t" / "x"}[where]
    found = {"inside": f"it lies inside '{first}', a pipeline's root",
             "above": f"it holds '{first}', a pipeline's root",
             "table": f"it lies inside '{views / 't'}', a Delta table"}[where]
    capfd.readouterr()
    dr = dag.test(logical_date=intervals.end(1), run_conf={"storage_root": str(target), "owners": [OWNER]})
    logged = "".join(capfd.readouterr())
    got = states(dr)
    assert got["wait_for_interval"] == "success" and got["plan"] == "failed", got
    assert f"StorageRootOverlapError: the storage root '{target}' overlaps another one: {found}" in logged, \
        logged[-3000:]
    assert files_below(views) == before  # nothing written
    assert deltalake_rows(views / "t") == 2


def deltalake_rows(uri) -> int:
    from deltalake import DeltaTable

    return DeltaTable(str(uri)).to_pyarrow_table().num_rows


# ---------------------------------------------------------------------------------------------
# 2. a check, then a write: two first plans at once
# ---------------------------------------------------------------------------------------------

def concurrent_first_plans(root: str, lookbacks: tuple[int, ...], tmp_path, monkeypatch) -> list[object]:
    """Each lookback a DAG's own setting; their first ``plan`` of one interval on ``root`` at once
    (threads, the real JetStreamHook on the test server). Returns each plan's result or error."""
    from airflow_provider_plgd import spark_deps
    from airflow_provider_plgd.etl import DEFAULT_PARAMS, plan_interval
    from airflow_provider_plgd.run_params import check_run_params, run_spark_conf_policy
    from airflow_provider_plgd.tables import identity

    monkeypatch.setenv(spark_deps.PY_FILES_DIR_ENV, str(tmp_path / "py_files"))
    # Each plan reads the recorded identity twice before it records its own (plan's check, then
    # record's). Here every plan waits for the others after each of these reads, so all of them
    # reach the write together: the window a check-then-write leaves open, every time.
    real_recorded, reads = identity.recorded, threading.local()
    synced = threading.Barrier(len(lookbacks))

    def recorded_in_step(layout):
        found = real_recorded(layout)
        reads.n = getattr(reads, "n", 0) + 1
        if reads.n <= 2:
            synced.wait(timeout=60)
        return found

    monkeypatch.setattr(identity, "recorded", recorded_in_step)
    end = datetime.fromtimestamp((int(time.time() // INTERVAL) - 1) * INTERVAL, tz=UTC)
    start = datetime.fromtimestamp(end.timestamp() - INTERVAL, tz=UTC)
    barrier = threading.Barrier(len(lookbacks))
    results: list[object] = [None] * len(lookbacks)

    def run(i: int, lookback: int) -> None:
        params = {**DEFAULT_PARAMS, "storage_root": root, "settle_seconds": 0, "lookback_intervals": lookback}
        policy = run_spark_conf_policy(None)
        author = check_run_params(params, spark_conf_policy=policy, storage_roots=[root],
                                  jetstream_conn_id="plgd_jetstream_default")
        barrier.wait()
        try:
            results[i] = plan_interval(params, start=start, end=end, dag_id=f"dag_{i}",
                                       jetstream_conn_id="plgd_jetstream_default", spark_conf_policy=policy,
                                       allowed_roots=[root], author=author)
        except Exception as err:  # the test sorts the outcomes
            results[i] = err

    threads = [threading.Thread(target=run, args=(i, lb)) for i, lb in enumerate(lookbacks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def assert_one_winner(results: list[object], recorded: dict, lookbacks: tuple[int, ...]) -> None:
    won = [i for i, r in enumerate(results) if not isinstance(r, Exception)]
    assert len(won) == 1, results
    lost = [r for i, r in enumerate(results) if i not in won]
    assert all("PipelineIdentityError" in str(r) and "lookback_intervals" in str(r) for r in lost), lost
    assert recorded["lookback_intervals"] == lookbacks[won[0]]


@pytest.mark.parametrize("round_", range(2))
def test_concurrent_first_plans_on_a_local_root_exactly_one_records_its_identity(jetstream, tmp_path,
                                                                               monkeypatch, round_):
    """Four DAGs with other lookbacks plan their first interval on one new root at once: one
    records its identity, each other is refused with PipelineIdentityError (before: a check, then a
    write; several passed and pipeline.json kept the last writer's)."""
    root = tmp_path / "root"
    lookbacks = (24, 6, 12, 3)
    results = concurrent_first_plans(str(root), lookbacks, tmp_path, monkeypatch)
    recorded = json.loads((root / "_ledger" / "pipeline.json").read_text())
    assert_one_winner(results, recorded, lookbacks)
    assert not list((root / "_ledger").glob(".*inprogress"))  # no temporary file left


def test_concurrent_first_plans_on_an_s3_root_exactly_one_records_its_identity(jetstream, s3, tmp_path,
                                                                             monkeypatch):
    """The same on S3 (moto): one conditional PUT (``If-None-Match: *``) wins."""
    import fsspec

    root = f"s3://{s3.bucket}/root"
    lookbacks = (24, 6, 12, 3)
    results = concurrent_first_plans(root, lookbacks, tmp_path, monkeypatch)
    recorded = json.loads(fsspec.filesystem("s3").cat_file(f"{s3.bucket}/root/_ledger/pipeline.json"))
    assert_one_winner(results, recorded, lookbacks)


# ---------------------------------------------------------------------------------------------
# 3. a recorded narrower view binds every later run on its root
# ---------------------------------------------------------------------------------------------

def test_a_recorded_narrower_view_refuses_a_later_run_with_the_default_selection(jetstream, dags_folder, tmp_path,
                                                                                capfd):
    """A first run with ``owners=[A]`` on another allowed root records that root as owner A. A later
    run there without ``owners`` (every owner, the DAG's default) used to run silently with owner A
    (the tasks kept the earlier run's value) and reconcile; now it is refused, naming the setting."""
    lake, views = tmp_path / "lake", tmp_path / "views"
    dag = etl_dag(dags_folder, "plgd_test_guard_view", lake, [views])
    intervals = Intervals(2)
    view = views / "owner-a"
    dr = dag.test(logical_date=intervals.end(0), run_conf={"storage_root": str(view), "owners": [OWNER]})
    assert states(dr)["summary"] == "success", states(dr)
    assert json.loads((view / "_ledger" / "pipeline.json").read_text())["owners"] == [OWNER]
    ledgers = sorted(p.name for p in (view / "_ledger" / "EVENTS").iterdir())
    capfd.readouterr()
    dr = dag.test(logical_date=intervals.end(1), run_conf={"storage_root": str(view)})
    logged = "".join(capfd.readouterr())
    got = states(dr)
    assert got["plan"] == "failed" and got["summary"] == "upstream_failed", got
    assert f"PipelineIdentityError: this run's settings differ from the pipeline's identity (recorded in " \
           f"{view}/_ledger/pipeline.json):\n  owners: recorded in {view}/_ledger/pipeline.json ['{OWNER}'], " \
           "this run all owners" in logged, logged[-3000:]
    assert sorted(p.name for p in (view / "_ledger" / "EVENTS").iterdir()) == ledgers  # no ledger of the run


def test_a_narrower_run_on_the_connections_root_is_the_dags_own_root(jetstream, dags_folder, tmp_path, capfd,
                                                                    monkeypatch):
    """The DAG's default root is ``""``: the connection's ``storage_root``. A run that names that root
    is a run on the DAG's own root, so it may not narrow the selection. Before, it counted as
    another root, recorded the DAG's own root as owner A, and every later run of the DAG failed."""
    conn_root = tmp_path / "conn-root"
    conn = {"conn_type": "plgd_jetstream", "host": jetstream.host, "port": jetstream.port,
            "extra": {"stream": "EVENTS", "storage_root": str(conn_root)}}
    monkeypatch.setenv("AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT", json.dumps(conn))
    dag = etl_dag(dags_folder, "plgd_test_guard_conn", "")
    intervals = Intervals(2)
    dr = dag.test(logical_date=intervals.end(0), run_conf={"storage_root": str(conn_root), "owners": [OWNER]})
    logged = "".join(capfd.readouterr())
    got = states(dr)
    assert got["wait_for_interval"] == "failed" and got["plan"] == "upstream_failed", got
    assert "PipelineIdentityError: " in logged and "\n  owners: the DAG author's all owners" in logged, logged[-3000:]
    assert files_below(conn_root) == []
    dr = dag.test(logical_date=intervals.end(1), run_conf={})
    assert states(dr)["summary"] == "success", states(dr)
    assert json.loads((conn_root / "_ledger" / "pipeline.json").read_text())["owners"] is None
