"""Benchmark: the cost of running Python tasks through ``spark.executor_tasks``, classic vs Connect.

Redoes docs/performance.md M11 (why the apps' tasks were plain RDD tasks) for the three ways the
applications can run their tasks since Spark Connect support:

- ``classic-rdd``: ``spark-submit`` (``local[--cores]``), ``spark.plgd.executorApi=rdd``
  (``parallelize(...).mapPartitions``, ``partitionBy``; the classic default);
- ``classic-dataframe``: the same ``spark-submit``, ``spark.plgd.executorApi=dataframe``
  (``spark.range(...).mapInArrow``, ``repartitionById`` + ``mapInArrow``);
- ``connect-dataframe``: a Spark Connect server (``plgd_devtools.spark_connect``, ``local[--cores]``,
  its Python workers on ``--executor-python``) and this file as a plain Python client
  (``SPARK_REMOTE``), which ships the provider with ``addArtifacts`` first.

Each way runs in a fresh JVM, with ``FAST_LOCAL_SPARK_CONF``, and measures: the session
(``getOrCreate`` and, on Connect, shipping the code), the **first job** of ``--tasks`` trivial
tasks (``run_tasks``; each returns one small record: Python workers start here), the same job
**warm** (``--repeat`` times, the best; per task: job seconds x cores / tasks), and a warm
**shuffle** job (``run_stages``: ``--tasks`` map tasks, each yielding one small pair per reduce
partition, and ``--reduce`` reduce partitions). Also the wall time of the whole process
(``spark-submit`` or the client) and, for Connect, of the server's start. Prints one JSON line
per way and a table. Holds the Spark lock (``/tmp/spark.lock``) per way. Usage::

    python -m bench.bench_executor_tasks [--tasks 75] [--reduce 8] [--repeat 3] [--cores 2]
        [--executor-python PATH] [--ways classic-rdd classic-dataframe connect-dataframe]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WAYS = ("classic-rdd", "classic-dataframe", "connect-dataframe")


def trivial(tasks):
    for t in tasks:
        yield {"task": t, "rows": 1}


def mapper(reduce: int):
    def task(tasks):
        for t in tasks:
            for p in range(reduce):
                yield p, (t, b"x" * 100)

    return task


def reducer(pairs):
    n = 0
    for _ in pairs:
        n += 1
    yield n


def worker(api: str, tasks: int, reduce: int, repeat: int, cores: int) -> dict:
    """In the Spark driver / Connect client: the timings of one way."""
    from airflow_provider_plgd.spark import executor_tasks, session

    t0 = time.perf_counter()
    spark = session.build_spark_session("plgd-bench-executor-tasks", {executor_tasks.EXECUTOR_API_CONF: api})
    session.ship_code(spark)
    out: dict = {"session_s": round(time.perf_counter() - t0, 2), "api": executor_tasks.executor_api(spark)}
    ids = list(range(tasks))
    t0 = time.perf_counter()
    first = executor_tasks.run_tasks(spark, ids, trivial)
    out["first_job_s"] = round(time.perf_counter() - t0, 2)
    assert [r["task"] for r in first] == ids
    warm = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        executor_tasks.run_tasks(spark, ids, trivial)
        warm.append(time.perf_counter() - t0)
    out["warm_job_s"] = round(min(warm), 3)
    out["warm_task_ms"] = round(min(warm) * cores / tasks * 1000, 1)
    shuffles = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        counts = executor_tasks.run_stages(spark, ids, mapper(reduce), executor_tasks.Shuffle(reduce, reducer))
        shuffles.append(time.perf_counter() - t0)
    assert counts == [tasks] * reduce, counts
    out["warm_shuffle_job_s"] = round(min(shuffles), 3)
    t0 = time.perf_counter()
    out["parallelism"] = executor_tasks.default_parallelism(spark)
    out["parallelism_s"] = round(time.perf_counter() - t0, 3)
    spark.stop()
    return out


def run_way(way: str, args: argparse.Namespace) -> dict:
    from plgd_devtools.spark import FAST_LOCAL_SPARK_CONF, spark_lock, spark_submit_env

    api = way.split("-", 1)[1]
    cmd_args = ["--worker", api, "--tasks", str(args.tasks), "--reduce", str(args.reduce),
                "--repeat", str(args.repeat), "--cores", str(args.cores)]
    result: dict = {"way": way}
    with spark_lock():
        if way.startswith("classic"):
            submit = shutil.which("spark-submit", path=str(Path(sys.executable).parent)) or "spark-submit"
            cmd = [submit, "--master", f"local[{args.cores}]", "--conf", "spark.ui.enabled=false"]
            for key, value in FAST_LOCAL_SPARK_CONF.items():
                cmd += ["--conf", f"{key}={value}"]
            env = {**spark_submit_env(), "PYTHONPATH": str(REPO)}
            t0 = time.perf_counter()
            proc = subprocess.run([*cmd, __file__, *cmd_args], env=env, capture_output=True, text=True, timeout=900)
            result["process_s"] = round(time.perf_counter() - t0, 2)
        else:
            from plgd_devtools.spark_connect import SparkConnectServer

            t0 = time.perf_counter()
            with SparkConnectServer(python=args.executor_python, master=f"local[{args.cores}]") as server:
                result["server_start_s"] = round(time.perf_counter() - t0, 2)
                env = {**os.environ, "SPARK_REMOTE": server.remote, "PYTHONPATH": str(REPO)}
                t0 = time.perf_counter()
                proc = subprocess.run([sys.executable, __file__, *cmd_args], env=env, capture_output=True,
                                      text=True, timeout=900)
                result["process_s"] = round(time.perf_counter() - t0, 2)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{way} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    result.update(json.loads(lines[-1]))
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench_executor_tasks", description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=75)
    parser.add_argument("--reduce", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--executor-python", default=os.environ.get("PLGD_EXECUTOR_PYTHON", sys.executable))
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    parser.add_argument("--worker", choices=("rdd", "dataframe"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.tasks, args.reduce, args.repeat, args.cores)), flush=True)
        return
    from bench.machine import busy_since, proc_stat

    rows = []
    for way in args.ways:
        start = proc_stat()
        row = run_way(way, args)
        row["machine_busy"] = busy_since(start)
        print(json.dumps(row), flush=True)
        rows.append(row)
    keys = ("server_start_s", "process_s", "session_s", "first_job_s", "warm_job_s", "warm_task_ms",
            "warm_shuffle_job_s", "parallelism_s", "machine_busy")
    print(f"\n{args.tasks} tasks, {args.reduce} reduce partitions, local[{args.cores}]")
    print("way".ljust(20) + "".join(k.rjust(20) for k in keys))
    for row in rows:
        print(row["way"].ljust(20) + "".join(str(row.get(k, "-")).rjust(20) for k in keys))


if __name__ == "__main__":
    main()
