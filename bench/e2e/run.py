"""Scale benchmark: simulated plgd traffic through the whole ETL DAG, stage by stage (figures, not a test).

Usage::

    PATH=.venv/bin:$PATH .venv/bin/python -m bench.e2e.run --events 1000000 --also 100000 --json e2e.json

On a local Spark standalone cluster, 1 worker and then 2 workers (1 core each), in one run::

    PATH=.venv/bin:$PATH .venv/bin/python -m bench.e2e.run --events 1000000 --also --cluster-workers 1 2 \
        --json e2e-cluster.json

``--compare-rev <git rev>``: before and after in one run: each size runs on a ``git worktree`` of
that revision and on the current tree, interleaved (before, after, before, after; ``--compare-rounds``
pairs) on the same cached traffic, then the table of both figures and their ratio (:mod:`bench.e2e.compare`).

``--ways classic connect``: each size runs both ways, classic ``spark-submit`` and a local Spark
Connect server (:mod:`bench.e2e.ways`), and ends with the table of each Spark stage split into app,
start (JVM, or the Connect client) and Airflow time, way against way.

``--cluster-workers N [M ...]``: for each size and each worker count, a fresh cluster
(:mod:`plgd_devtools.spark_cluster`, ``--worker-memory`` each) is the ``spark_default``
connection, the driver stays in the Airflow task (client mode, on 127.0.0.1) and the executors
run ``--executor-python`` (``.venv-executor`` when built) with ``--executor-memory``; then the table
of each Spark stage's time with the first and the last count and the speed-up (first / last), for
the task's wall time and the application's own time. The RSS columns miss the executors' JVMs
and Python workers there (children of the cluster workers, not of ``airflow dags test``).

For each size (smallest first):

1. **Traffic**: ``airflow_provider_plgd.simulator.generate`` with ``target_messages`` = the size,
   ``--owners`` owners x ``--devices`` devices each x ``--resources`` resources, 1% duplicates and
   a few corrupt payloads (realistic sizes: CBOR contents, links, metadata; ~350 B per message).
   Generating is slow pure Python (~40 s per 100k), so the messages are cached as Parquet under
   ``--cache-dir`` (keyed by the config; deterministic, so a cache hit is the same bytes).
2. **Publish** to a fresh local ``nats-server`` (``plgd_devtools.nats_server``,
   stream ``EVENTS`` with the plgd bundle settings), core NATS like plgd; not timed as a stage.
3. **The DAG, through Airflow itself**, like ``make demo`` (``plgd_devtools.demo``:
   temp ``AIRFLOW_HOME``, SQLite, Spark ``local[*]``): one data interval that covers the publish
   window, run by ``airflow dags test plgd_events_etl <interval end>`` with ``settle_seconds=1``.
   A sampler thread reads the RSS of the process tree (``airflow dags test`` + spark-submit JVM
   + Spark's Python processes) every ``--sample-period`` s.
4. **Per stage** (sensor, plan, fetch, decode, dedupe, rebuild, summary): wall time from the task
   instances' start/end in the metadata DB, events/s (= published messages / stage wall), peak
   RSS, and for the Spark stages the split of the task's wall time into app work (the app's run
   summary ``seconds``), JVM (spark-submit process wall - app seconds: JVM + SparkSession start,
   Python imports, shutdown) and Airflow (task wall - spark-submit wall).
5. **Ceilings on the same data**: the raw read rate (``bench.bench_hook_read``'s
   ``JetStreamHook.iter_batches("plgd.>")`` loop over the same stream) and the single-core decode
   rate (``bench.bench_decode.python_rate``: ``decode_batch`` over the DAG's staged files, reading
   not timed). Ratio = end-to-end time / (read seconds + decode seconds) (goal: <= 3x).

Then the growth from the smallest to the largest size: (time ratio) / (size ratio), 1.0 = linear.
Prints tables; ``--json`` writes every figure (schema: :func:`run_size` and :func:`main`).
The whole run holds an exclusive ``flock`` on ``--lock`` (default ``/tmp/spark.lock``), and
records ``uptime`` (load averages) before and after: the machine may be shared.

Errors: ``SystemExit`` with the command's log tail when the DAG run fails; ``RuntimeError`` when
the stream does not hold every published message.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from airflow_provider_plgd.tables.layout import Layout  # noqa: E402
from bench.e2e.figures import fit_deadline, growth, print_growth, print_size, print_speedup  # noqa: E402
from bench.e2e.sampler import TreeSampler  # noqa: E402
from bench.e2e.stages import SPARK_STAGES, read_task_instances, stage_figures  # noqa: E402
from bench.e2e.traffic import apublish, load_messages, sim_config  # noqa: E402
from bench.machine import busy_since, exclusive_lock, machine, proc_stat, uptime  # noqa: E402
from plgd_devtools.spark import FAST_LOCAL_SPARK_CONF  # noqa: E402

# ------------------------------------------------------------------------------------------------
# ceilings (same stream, same staged data)
# ------------------------------------------------------------------------------------------------

def read_ceiling(expected: int) -> dict[str, Any]:
    """Raw read rate of the stream: ``bench.bench_hook_read``'s ``iter_batches("plgd.>")`` loop.

    :return: ``{"messages", "bytes", "seconds" (wall), "cpu_s" (this process), "rate" (msgs/s)}``.
    :raises RuntimeError: it read a different number of messages than ``expected``.
    """
    from airflow_provider_plgd.hooks.jetstream import DEFAULT_BATCH_SIZE
    from bench.bench_hook_read import _hook_read

    t0, c0 = time.perf_counter(), time.process_time()
    count, nbytes = _hook_read(DEFAULT_BATCH_SIZE)
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    if count != expected:
        raise RuntimeError(f"read ceiling: read {count} messages, expected {expected}")
    return {"messages": count, "bytes": nbytes, "seconds": round(secs, 3), "cpu_s": round(cpu, 3),
            "rate": round(count / secs, 1)}


def decode_ceiling(root: str, interval_id: str, stream: str = "EVENTS") -> dict[str, Any]:
    """Single-core decode rate of the DAG's staged data: ``bench.bench_decode.python_rate``.

    ``python_rate`` reads its interval from the module constant ``INTERVAL_ID``; it is set to this
    run's interval for the call and restored after.

    :return: ``{"rows", "decoded", "seconds" (decode only; reading is not timed), "rate" (decoded/s),
        "row_rate" (rows/s)}``.
    """
    import bench.bench_decode as bd

    saved = bd.INTERVAL_ID
    bd.INTERVAL_ID = interval_id
    try:
        result = bd.python_rate(root, stream=stream)
    finally:
        bd.INTERVAL_ID = saved
    return {"rows": result["rows"], "decoded": result["decoded"], "seconds": round(result["seconds"], 3),
            "rate": round(result["rate"], 1), "row_rate": round(result["rows"] / result["seconds"], 1)}


# ------------------------------------------------------------------------------------------------
# one size
# ------------------------------------------------------------------------------------------------

def cluster_spark_conf(args: argparse.Namespace) -> dict[str, str]:
    """The DAG's Spark settings on the local standalone cluster: the driver on 127.0.0.1, the
    executors' memory and Python (``--executor-python``), then ``--spark-conf`` (a JSON object) over them."""
    conf = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.memory": args.executor_memory, "spark.pyspark.python": args.executor_python}
    if args.spark_conf and args.spark_conf != "fast-local":
        conf.update(json.loads(args.spark_conf))
    return conf


def run_size(args: argparse.Namespace, events: int, work: Path, master: str | None = None,
             connect: Any = None, tree: Path | None = None) -> dict[str, Any]:
    """Generate, publish, run the DAG, measure; return the figures of one size.

    ``tree``: the source tree whose package and ``dags/`` the DAG run uses (``--compare-rev``: a
    ``git worktree`` of another revision); default this one.

    ``master``: a ``spark://`` URL (the ``spark_default`` connection; the DAG's Spark settings are
    :func:`cluster_spark_conf`), default ``local[*]``. ``connect``: a started
    ``SparkConnectServer``: the DAG runs its Spark stages there (:func:`bench.e2e.ways.connect_env`).

    :return: ``{"target_events", "events" (published), "payload_bytes", "traffic" (cache info),
        "publish_s", "interval" {start, end (ISO), seconds, id}, "counts" {fetched, decoded,
        quarantined, deduped, duplicates}, "dag" {"wall_s" (``airflow dags test`` process),
        "span_s" (first task start -> last task end), "tasks_s" (sum of stage walls),
        "airflow_gaps_s" (wall - stage walls: CLI start, DAG parsing, scheduling between tasks),
        "machine_busy" (share of both cores busy, all processes), "events_per_s"}, "stages"
        (:func:`bench.e2e.stages.stage_figures`), "nats_peak_rss", "ceilings" {read, decode,
        sum_s}, "ratio_to_ceilings", "load_before", "load_after"}``. Times in seconds, RSS in bytes.
    """
    from airflow_provider_plgd import times
    from airflow_provider_plgd.tables import staging
    from airflow_provider_plgd.tables.run_summary import read_app_summary
    from plgd_devtools.demo import _airflow_env, _run
    from plgd_devtools.nats_server import NatsServer, recreate_stream

    result: dict[str, Any] = {"target_events": events, "load_before": uptime()}
    config = sim_config(args, events)
    t0 = time.perf_counter()
    subjects, data, info = load_messages(config, args.cache_dir)
    n = len(subjects)
    result.update(events=n, payload_bytes=info["bytes"], traffic={**info, "config": config.as_dict()})
    print(f"[e2e] {n:,} messages ({info['bytes'] / 1e6:.0f} MB payload; "
          f"{'cache ' + info['cache_file'] if info['cached'] else 'generated'} in "
          f"{time.perf_counter() - t0:.0f} s)", flush=True)

    shutil.rmtree(work, ignore_errors=True)
    (work / "data").mkdir(parents=True)
    log = work / "airflow.log"
    root = str(work / "data")
    with NatsServer(store_dir=work / "nats") as server:
        recreate_stream(server.url)
        pub_start = time.time()
        asyncio.run(apublish(server.url, subjects, data))
        pub_end = time.time()
        del subjects, data
        result["publish_s"] = round(pub_end - pub_start, 2)
        print(f"[e2e] published in {pub_end - pub_start:.1f} s to {server.url}", flush=True)

        # one data interval [start, end) covering every server timestamp, whole seconds
        start_s, end_s = math.floor(pub_start) - 1, math.ceil(pub_end) + 1
        start = datetime.fromtimestamp(start_s, tz=timezone.utc)
        end = datetime.fromtimestamp(end_s, tz=timezone.utc)
        interval_id = times.interval_id(start, end)
        result["interval"] = {"start": start.isoformat(), "end": end.isoformat(), "seconds": end_s - start_s,
                              "id": interval_id}
        env = _airflow_env(work, server.url, start, float(end_s - start_s))
        env["AIRFLOW__LOGGING__LOGGING_LEVEL"] = args.log_level
        if args.spark_conf:  # read by dags/plgd_events_etl.py (etl.build_etl_dag(spark_conf=...))
            env["PLGD_ETL_SPARK_CONF"] = (json.dumps(FAST_LOCAL_SPARK_CONF) if args.spark_conf == "fast-local"
                                          else args.spark_conf)
        if master:
            host, port = master.rsplit(":", 1)
            env["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps({"conn_type": "spark", "host": host, "port": int(port)})
            env["PLGD_ETL_SPARK_CONF"] = json.dumps(cluster_spark_conf(args))
            for key in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
                env.pop(key, None)  # as on a real Airflow worker: the settings above decide
        result["spark_master"] = master or "local[*]"
        if connect is not None:
            from bench.e2e.ways import connect_env

            env = connect_env(env, connect.port)
            result["spark_master"] = f"Spark Connect {connect.remote} ({connect.master})"
        if tree is not None:  # that tree's package first on the path, its DAG file
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), env.get("PYTHONPATH", "")) if p)
            env["AIRFLOW__CORE__DAGS_FOLDER"] = str(tree / "dags")
        _run([sys.executable, "-m", "airflow", "db", "migrate"], env, log)
        while time.time() < end_s + 1.5:  # the sensor's settle time (1 s) is over before the run
            time.sleep(0.1)

        cmd = [sys.executable, "-m", "airflow", "dags", "test", "plgd_events_etl", end.isoformat(),
               "-c", json.dumps({"settle_seconds": 1})]
        print(f"[e2e] airflow dags test for {interval_id} ...", flush=True)
        stat0 = proc_stat()
        t_start = time.time()
        with log.open("ab") as fh:
            proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=tree or REPO)
            extra = {"nats": server.pid, **({"connect": connect.proc.pid} if connect is not None else {})}
            with TreeSampler(proc.pid, period=args.sample_period, extra_pids=extra) as sampler:
                rc = proc.wait()
        t_end = time.time()
        busy = busy_since(stat0)
        if rc != 0:
            tail = log.read_text(errors="replace").splitlines()[-60:]
            raise SystemExit(f"airflow dags test failed ({rc}); log {log}:\n" + "\n".join(tail))

        tis = read_task_instances(str(work / "airflow" / "airflow.db"))
        bad = [ti for ti in tis if ti["state"] != "success"]
        if bad:
            raise SystemExit(f"task instances not successful: {bad}; log {log}")
        apps = {app: read_app_summary(Layout.of(root), app, interval_id) for app in SPARK_STAGES}
        stages = stage_figures(tis, sampler, n, apps)
        fetched = sum(f.rows for f in staging.staged_files(Layout.of(root), "EVENTS", interval_id=interval_id))
        decode, dedupe = apps.get("decode") or {}, apps.get("dedupe") or {}
        result["counts"] = {"fetched": fetched, "decoded": decode.get("decoded"),
                            "quarantined": decode.get("quarantined"),
                            "deduped": dedupe.get("output"),
                            "dedupe_summary": {k: v for k, v in dedupe.items() if isinstance(v, (int, float))},
                            "rebuild_summary": {k: v for k, v in (apps.get("rebuild") or {}).items()
                                                if isinstance(v, (int, float))}}
        if fetched != n:
            raise SystemExit(f"the DAG fetched {fetched} messages of {n} published (interval {interval_id})")
        wall = t_end - t_start
        stage_walls = sum(s["wall_s"] for s in stages.values())
        result["dag"] = {"wall_s": round(wall, 3),
                         "span_s": round(max(ti["end"] for ti in tis) - min(ti["start"] for ti in tis), 3),
                         "tasks_s": round(stage_walls, 3), "airflow_gaps_s": round(wall - stage_walls, 3),
                         "machine_busy": busy, "events_per_s": round(n / wall, 1),
                         "peak_rss": sampler.peak(t_start, t_end), "samples": len(sampler.samples)}
        result["stages"] = stages
        result["nats_peak_rss"] = sampler.extra.get("nats")
        if connect is not None:
            result["connect_server_peak_rss"] = sampler.extra.get("connect")

        # ceilings, same stream and same staged files
        os.environ["AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT"] = env["AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT"]
        read = read_ceiling(n)
        dec = decode_ceiling(root, interval_id)
        ceiling_sum = read["seconds"] + dec["seconds"]
        result["ceilings"] = {"read": read, "decode": dec, "sum_s": round(ceiling_sum, 3)}
        result["ratio_to_ceilings"] = round(wall / ceiling_sum, 2)
        result["ratio_span_to_ceilings"] = round(result["dag"]["span_s"] / ceiling_sum, 2)
    result["load_after"] = uptime()
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return result


@contextlib.contextmanager
def connect_server(args: argparse.Namespace, way: str, out: dict[str, Any]):
    """For ``way`` ``connect``: a local Spark Connect server (``local[*]``, Python workers on
    ``--executor-python``; the fast-local settings only with ``--spark-conf fast-local``, as the
    classic way), its start time appended to ``out["connect_server_start_s"]``; else None."""
    if way != "connect":
        yield None
        return
    from plgd_devtools.spark_connect import SparkConnectServer

    server = SparkConnectServer(python=args.executor_python, master="local[*]",
                                fast_local=args.spark_conf == "fast-local")
    t0 = time.perf_counter()
    server.start()
    out.setdefault("connect_server_start_s", []).append(round(time.perf_counter() - t0, 1))
    print(f"[e2e] Spark Connect server {server.remote} up in {out['connect_server_start_s'][-1]} s", flush=True)
    try:
        yield server
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; print the tables; return (and with ``--json`` write) every figure:
    ``{"machine", "args", "lock_wait_s", "load_before", "load_after", "sizes": [run_size ...],
    "growth": growth(smallest, largest) | None}``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="messages of the main size (default 1M)")
    parser.add_argument("--also", type=int, nargs="*", default=[100_000],
                        help="other sizes, for the growth figure (default 100000; none: --also)")
    parser.add_argument("--owners", type=int, default=8)
    parser.add_argument("--devices", type=int, default=500, help="devices per owner (default 500: 4,000 devices)")
    parser.add_argument("--resources", type=int, default=4, help="resources per device")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", default=None, help="write the figures to this JSON file")
    parser.add_argument("--workdir", default=None, help="work folder (default: a temp dir)")
    parser.add_argument("--cache-dir", default=str(Path(tempfile.gettempdir()) / "plgd-e2e-cache"),
                        help="cache of generated traffic ('' = none)")
    parser.add_argument("--lock", default="/tmp/spark.lock", help="flock held for the whole run ('' = none)")
    parser.add_argument("--sample-period", type=float, default=0.2, help="RSS sampling period, seconds")
    parser.add_argument("--keep", action="store_true", help="keep each size's work folder")
    parser.add_argument("--deadline", default="", help="HH:MM UTC: skip a larger size whose estimate "
                        "(from the smallest size) ends after it, running --fallback instead if that fits")
    parser.add_argument("--fallback", type=int, default=300_000, help="size to run instead (default 300000)")
    parser.add_argument("--log-level", default="WARNING", help="Airflow logging level of the DAG run (its log: "
                        "<workdir>/n<size>/airflow.log)")
    parser.add_argument("--spark-conf", default="",
                        help="PLGD_ETL_SPARK_CONF for the DAG: a JSON object of Spark settings or 'fast-local' "
                             "(default '': the DAG's defaults, as deployed)")
    parser.add_argument("--ways", nargs="+", default=["classic"], choices=["classic", "connect"],
                        help="run each size on classic spark-submit and/or a local Spark Connect server, in this "
                             "order; with both, print the stages way against way (default: classic)")
    parser.add_argument("--cluster-workers", type=int, nargs="*", default=[],
                        help="run each size on a local Spark standalone cluster (plgd_devtools.spark_cluster) "
                             "with each of these worker counts, 1 core each, in this order (e.g. 1 2); "
                             "prints the per-stage speed-up of the last count over the first. Default: local[*]")
    parser.add_argument("--worker-memory", default="3g", help="memory of each cluster worker (default 3g)")
    parser.add_argument("--executor-memory", default="2g", help="spark.executor.memory on the cluster (default 2g)")
    parser.add_argument("--compare-rev", default="",
                        help="also run each size on this git revision (a temporary git worktree), interleaved "
                             "with the current tree on the same traffic (before, after, ...), and print both "
                             "figures and their ratio (bench.e2e.compare)")
    parser.add_argument("--compare-rounds", type=int, default=2,
                        help="--compare-rev: before/after pairs per size (default 2)")
    parser.add_argument("--executor-python", default=str(REPO / ".venv-executor" / "bin" / "python")
                        if (REPO / ".venv-executor" / "bin" / "python").exists() else sys.executable,
                        help="spark.pyspark.python on the cluster (default .venv-executor's, else this Python)")
    args = parser.parse_args(argv)

    sizes = sorted({args.events, *args.also})
    base = Path(args.workdir or tempfile.mkdtemp(prefix="plgd-e2e-"))
    out: dict[str, Any] = {"machine": machine(), "args": vars(args), "sizes": [], "growth": None}
    with exclusive_lock(args.lock) as waited:
        out["lock_wait_s"] = round(waited, 1)
        out["load_before"] = uptime()
        print(f"[e2e] {out['load_before']['uptime']}", flush=True)
        if args.compare_rev:
            from bench.e2e.compare import compare_revision

            out["compare"] = compare_revision(args, sizes, base, run_size)
            sizes = []  # the comparison is the run
        for i, size in enumerate(sizes):
            if i and args.deadline:
                size = fit_deadline(out["sizes"][0], size, args.fallback, args.deadline)
                if size is None:
                    break
            if not args.cluster_workers:
                by_way = {}
                for way in args.ways:
                    with connect_server(args, way, out) as server:
                        r = run_size(args, size, base / f"n{size}-{way}", connect=server)
                    r["way"] = way
                    by_way[way] = r
                    print_size(r)
                out["sizes"].append(next(iter(by_way.values())))
                if len(by_way) > 1:
                    from bench.e2e.ways import compare

                    out.setdefault("ways", []).append({"by_way": by_way, "table": compare(by_way)})
            else:
                from plgd_devtools.spark_cluster import SparkCluster

                runs = []
                for workers in args.cluster_workers:
                    with SparkCluster(workers=workers, cores=1, memory=args.worker_memory,
                                      base_dir=str(base / f"cluster-{workers}w")) as cluster:
                        print(f"[e2e] Spark standalone {cluster.master_url}: {workers} workers x 1 core", flush=True)
                        r = run_size(args, size, base / f"n{size}-{workers}w", master=cluster.master_url)
                    r["cluster_workers"] = workers
                    runs.append(r)
                    print_size(r)
                out["sizes"].append(runs[0])
                out.setdefault("cluster_runs", []).append(runs)
                if len(runs) > 1:
                    out.setdefault("speedup", []).append(
                        {"events": size, "workers": [runs[0]["cluster_workers"], runs[-1]["cluster_workers"]],
                         "stages": print_speedup(runs[0], runs[-1])})
            if args.json:  # after every size, so an interrupted run keeps what it measured
                Path(args.json).write_text(json.dumps(out, indent=2, default=str) + "\n")
        out["load_after"] = uptime()
    if len(out["sizes"]) > 1:
        out["growth"] = growth(out["sizes"][0], out["sizes"][-1])
        print_growth(out["growth"])
    print(f"\n[e2e] load before {out['load_before']['loadavg']}, after {out['load_after']['loadavg']} "
          f"(1/5/15 min; 2 cores, shared machine)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str) + "\n")
        print(f"[e2e] figures written to {args.json}")
    if not args.workdir and not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    return out


if __name__ == "__main__":
    main()
