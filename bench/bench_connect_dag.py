"""Benchmark: the fixed cost of a tiny interval through the ETL DAG, sensor to summary, on Spark
Connect (``build_etl_dag(spark_connect_conn_id=...)``) and, to compare, on classic ``spark-submit``.

One run per way, each a fresh DAG on a fresh storage root: a few simulated plgd messages are
published into one short interval of a real nats-server, then ``dag.test()`` runs the interval
(the tasks in this process; decode, dedupe and rebuild are Spark Connect client processes on a
local Spark Connect server, ``local[--cores]``, its Python workers on ``--executor-python``, or
``spark-submit`` in ``local[--cores]``). The figure is the wall time from the sensor's start to
the summary's end (the task instances' start and end dates), and each Spark task's duration.
The Connect server's start is measured apart (it is a long-running service, not a per-run cost).
Airflow runs on a temp ``AIRFLOW_HOME`` (SQLite). Holds the Spark lock (``/tmp/spark.lock``) per
run. Prints one JSON line per way (Airflow's own log goes to the console too). Usage::

    python -m bench.bench_connect_dag [--ways connect classic] [--cores 2] [--executor-python PATH] | grep '^{'

Per way it prints the Spark tasks' durations with the applications' own time and phases (their
run summaries), the other tasks' durations and the gaps between tasks. The figures:
docs/spark-connect.md, "Fixed cost of a tiny interval".
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INTERVAL = 4.0
DAG_FILE = """
from datetime import datetime, timedelta, timezone
from airflow_provider_plgd.etl import build_etl_dag
from plgd_devtools.spark import FAST_LOCAL_SPARK_CONF

dag = build_etl_dag(dag_id=DAG_ID, schedule=timedelta(seconds=INTERVAL),
                    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc), catchup=False,
                    default_args={"retries": 0}, params={"settle_seconds": 0, "storage_root": ROOT}, SPARK_ARGS)
"""


def _load_dag(path: Path, dag_id: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_plgd_bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def run_way(way: str, work: Path, nats_url: str, remote_port: int | None, cores: int) -> dict:
    """One tiny interval through ``dag.test()``; the figures of ``way``."""
    from airflow_provider_plgd import times
    from airflow_provider_plgd.simulator import SimulationConfig, generate, publish
    from airflow_provider_plgd.tables.layout import Layout
    from airflow_provider_plgd.tables.run_summary import read_app_summary
    from plgd_devtools.spark import spark_lock, spark_submit_env

    dag_id = f"plgd_bench_{way}"
    root = work / f"root-{way}"
    if way == "connect":
        os.environ["AIRFLOW_CONN_BENCH_SPARK_CONNECT"] = json.dumps(
            {"conn_type": "spark_connect", "host": "localhost", "port": remote_port})
        spark = 'spark_connect_conn_id="bench_spark_connect"'
    else:
        os.environ.update(spark_submit_env())
        os.environ["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps({"conn_type": "spark", "host": f"local[{cores}]"})
        spark = "spark_conf=FAST_LOCAL_SPARK_CONF"
    text = (DAG_FILE.replace("DAG_ID", repr(dag_id)).replace("INTERVAL", repr(INTERVAL))
            .replace("ROOT", repr(str(root))).replace("SPARK_ARGS", spark))
    from airflow.configuration import conf

    folder = Path(conf.get("core", "dags_folder"))  # dag.test() needs the DAG in the dags-folder bundle
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dag_id}.py"
    path.write_text(text)
    dag = _load_dag(path, dag_id)

    start_s = (int(time.time() // INTERVAL) + 1) * INTERVAL
    sim = generate(SimulationConfig(seed=3, owners=1, devices_per_owner=1, resources_per_device=1, intervals=1,
                                    steps_per_interval=4, interval_seconds=INTERVAL,
                                    start_time_ns=int(start_s * 1e9), duplicates=0.0, corrupt=0))
    publish(sim, servers=[nats_url], stream="EVENTS", wait_for_intervals=True)
    end_s = start_s + INTERVAL
    time.sleep(max(0.0, end_s + 0.3 - time.time()))
    with spark_lock():
        t0 = time.perf_counter()  # after the lock: not the wait for another Spark job
        dr = dag.test(logical_date=datetime.fromtimestamp(end_s, tz=timezone.utc))
    wall = time.perf_counter() - t0
    interval_id = times.Interval.of(datetime.fromtimestamp(start_s, tz=timezone.utc),
                                    datetime.fromtimestamp(end_s, tz=timezone.utc)).id
    tis = {ti.task_id: ti for ti in dr.get_task_instances() if ti.map_index in (-1, 0)}
    states = {t: str(getattr(ti.state, "value", ti.state)) for t, ti in tis.items()}
    out = {"way": way, "messages": len(sim.messages), "states_ok": all(s == "success" for s in states.values()),
           "dag_test_wall_s": round(wall, 1)}
    if out["states_ok"]:
        out["sensor_to_summary_s"] = round(
            (tis["summary"].end_date - tis["wait_for_interval"].start_date).total_seconds(), 1)
        for task in ("decode", "dedupe", "rebuild"):
            out[f"{task}_s"] = round((tis[task].end_date - tis[task].start_date).total_seconds(), 1)
            # the application's own time (run summary: session up to the committed output)
            app = read_app_summary(Layout.of(str(root)), task, interval_id) or {}
            out[f"{task}_app_s"] = round(float(app.get("seconds", 0.0)), 1)
            out[f"{task}_phases_s"] = app.get("phase_seconds")
        # where the rest goes: every other task, and the gaps between tasks (dag.test's scheduling)
        order = sorted(tis.values(), key=lambda ti: ti.start_date)
        out["other_tasks_s"] = {t: round((ti.end_date - ti.start_date).total_seconds(), 1) for t, ti in tis.items()
                                if t not in ("decode", "dedupe", "rebuild")}
        out["gaps_s"] = round(sum(max(0.0, (b.start_date - a.end_date).total_seconds())
                                  for a, b in itertools.pairwise(order)), 1)
    else:
        out["states"] = states
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ways", nargs="+", default=["connect", "classic"], choices=["connect", "classic"])
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--executor-python", default=os.environ.get("PLGD_EXECUTOR_PYTHON")
                        or str(REPO / ".venv-executor" / "bin" / "python"))
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="plgd-bench-connect-dag-"))
    os.environ.update({"AIRFLOW_HOME": str(work / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                       "AIRFLOW__CORE__UNIT_TEST_MODE": "True"})
    for key in ("SPARK_REMOTE", "SPARK_CONNECT_AUTHENTICATE_TOKEN"):
        os.environ.pop(key, None)
    from airflow.utils import db

    from plgd_devtools.nats_server import NatsServer, recreate_stream
    from plgd_devtools.spark import spark_lock
    from plgd_devtools.spark_connect import SparkConnectServer

    db.initdb()
    server = None
    try:
        with NatsServer(store_dir=work / "nats") as nats:
            recreate_stream(nats.url)
            os.environ["AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT"] = json.dumps(
                {"conn_type": "plgd_jetstream", "host": nats.host, "port": nats.port, "extra": {"stream": "EVENTS"}})
            for way in args.ways:
                port = None
                if way == "connect":
                    server = SparkConnectServer(python=args.executor_python, master=f"local[{args.cores}]")
                    with spark_lock():
                        t0 = time.perf_counter()  # not the wait for another Spark job
                        server.start()
                    print(json.dumps({"connect_server_start_s": round(time.perf_counter() - t0, 1)}), flush=True)
                    port = server.port
                print(json.dumps(run_way(way, work, nats.url, port, args.cores)), flush=True)
                if server is not None:
                    server.stop()
                    server = None
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
