"""``dags/example_plgd_reuse.py`` (a user's own DAG with our sensor and fetch operator and their own
downstream task) runs on Airflow 3's DEFAULT settings, not in unit-test mode.

``tests/conftest.py`` sets ``AIRFLOW__CORE__UNIT_TEST_MODE=True``, which among other things makes a
``timedelta`` schedule a data-interval timetable; users never have it. So Airflow runs here in
subprocesses with a temporary ``AIRFLOW_HOME`` (SQLite), ``AIRFLOW__CORE__UNIT_TEST_MODE=False``,
a real nats-server with simulated plgd traffic, and ``airflow dags test`` for one interval:

* the example as shipped (``DeltaDataIntervalTimetable``; its interval shortened to a few
  seconds by replacing the ``INTERVAL`` line) stages every message of the interval and its own
  task counts them per owner and event type, equal to what was published;
* the same file with the obvious ``schedule=INTERVAL`` gets Airflow 3's ``DeltaTriggerTimetable``,
  a zero-width data interval, and the fetch fails with an error that names the fix.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tests.integration.conftest import read_stream

pytestmark = [pytest.mark.airflow]

REPO = Path(__file__).resolve().parents[2]
STEP = 8
SHIPPED = "INTERVAL = timedelta(hours=1)\n"


def _env(home: Path, dags: Path, root: Path, nats_server) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update({
        "PATH": str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""),
        "PYTHONPATH": str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",  # Airflow 3's defaults, as users run it
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT": json.dumps({
            "conn_type": "plgd_jetstream", "host": nats_server.host, "port": nats_server.port,
            "extra": {"stream": "EVENTS", "storage_root": str(root)}}),
    })
    return env


def _airflow(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "airflow", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=env["AIRFLOW_HOME"])


def test_reuse_example_runs_without_unit_test_mode_and_names_the_timetable_fix(jetstream, tmp_path):
    from airflow_provider_plgd.plgd.subjects import parse_subject
    from airflow_provider_plgd.simulator import SimulationConfig, generate, publish

    t0 = time.monotonic()
    home, dags, root = tmp_path / "airflow", tmp_path / "dags", tmp_path / "data"
    for path in (home, dags, root):
        path.mkdir()
    source = (REPO / "dags" / "example_plgd_reuse.py").read_text()
    assert SHIPPED in source and "schedule=DeltaDataIntervalTimetable(INTERVAL)" in source
    short = source.replace(SHIPPED, f"INTERVAL = timedelta(seconds={STEP})\n")
    (dags / "example_plgd_reuse.py").write_text(short)
    plain = (short.replace("schedule=DeltaDataIntervalTimetable(INTERVAL)", "schedule=INTERVAL")
             .replace('dag_id="example_plgd_reuse"', 'dag_id="example_plgd_reuse_plain_delta"'))
    (dags / "example_plgd_reuse_plain_delta.py").write_text(plain)
    env = _env(home, dags, root, jetstream)
    proc = _airflow(env, "db", "migrate")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # Airflow's defaults really are in effect: the plain timedelta becomes a trigger timetable
    probe = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u, sys\n"
         f"s = u.spec_from_file_location('p', {str(dags / 'example_plgd_reuse_plain_delta.py')!r})\n"
         "m = u.module_from_spec(s); s.loader.exec_module(m)\n"
         "print(type(m.dag.timetable).__name__)"],
        env=env, capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip().splitlines()[-1] == "DeltaTriggerTimetable", probe.stdout + probe.stderr

    start_s = (int(time.time() // STEP) + 1) * STEP
    sim = generate(SimulationConfig(seed=5, owners=2, devices_per_owner=2, resources_per_device=2, intervals=1,
                                    steps_per_interval=15, interval_seconds=STEP,
                                    start_time_ns=int(start_s * 1e9)))
    publish(sim, servers=[jetstream.url], stream="EVENTS", wait_for_intervals=True)
    end_s = start_s + STEP
    truth = read_stream(jetstream.url)
    assert all(start_s * 1e9 <= t < end_s * 1e9 for _s, t, _h, _d in truth.values()), "publishing was too slow"
    expected: dict[str, Counter] = {}
    for subject, _t, _h, _d in truth.values():
        parsed = parse_subject(subject)
        expected.setdefault(parsed.owner_id, Counter())[parsed.event_type] += 1
    time.sleep(max(0.0, end_s + 0.5 - time.time()))
    end = datetime.fromtimestamp(end_s, tz=timezone.utc).isoformat()

    # 1. The example as shipped: a data interval, every message staged and counted by the user's task.
    proc = _airflow(env, "dags", "test", "example_plgd_reuse", end, "-c", json.dumps({"settle_seconds": 0}))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    with sqlite3.connect(home / "airflow.db") as db:
        rows = db.execute("SELECT value FROM xcom WHERE dag_id = 'example_plgd_reuse' AND "
                          "task_id = 'count_event_types' AND key = 'return_value'").fetchall()
        states = dict(db.execute("SELECT task_id, state FROM task_instance WHERE dag_id = 'example_plgd_reuse'"))
    assert states == {"wait_for_interval": "success", "fetch": "success", "count_event_types": "success"}, states
    assert len(rows) == 1, rows
    value = json.loads(rows[0][0])
    value = json.loads(value) if isinstance(value, str) else value
    assert value["count"] == len(truth) > 0 and value["other_subjects"] == 0
    assert value["per_owner"] == {o: dict(sorted(c.items())) for o, c in sorted(expected.items())}
    assert value["interval_id"].startswith(datetime.fromtimestamp(start_s, tz=timezone.utc).strftime("%Y%m%dT%H%M%S"))

    # 2. schedule=timedelta on Airflow 3: a zero-width interval, and the error names the fix.
    proc = _airflow(env, "dags", "test", "example_plgd_reuse_plain_delta", end, "-c",
                    json.dumps({"settle_seconds": 0}))
    logs = "\n".join(p.read_text(errors="replace") for p in (home / "logs").rglob("*.log")
                     if "example_plgd_reuse_plain_delta" in str(p))
    text = proc.stdout + proc.stderr + logs
    with sqlite3.connect(home / "airflow.db") as db:
        states = dict(db.execute("SELECT task_id, state FROM task_instance "
                                 "WHERE dag_id = 'example_plgd_reuse_plain_delta'"))
    assert states.get("fetch") == "failed", (states, text[-3000:])
    assert "data interval is empty" in text and "DeltaDataIntervalTimetable" in text, text[-3000:]
    assert "CronDataIntervalTimetable" in text
    print(f"[test_reuse_example] {time.monotonic() - t0:.1f} s")
