"""Airflow 2.11 gets the pipeline's metrics too: ``etl.metrics`` sends them through Airflow 2's
``airflow.stats.Stats`` (configured from ``[metrics]``), caught by a StatsD listener on loopback.
The emission runs in a fresh Python process (Stats reads ``[metrics]`` once per process). Skipped
on Airflow 3 (``tests/integration/test_metrics_monitor.py`` covers it there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_provider_plgd.compat import AIRFLOW_V_3
from plgd_devtools.statsd_listener import StatsdListener

pytestmark = [pytest.mark.airflow2, pytest.mark.skipif(AIRFLOW_V_3, reason="Airflow 2.x only (make test-airflow2)")]
REPO = Path(__file__).resolve().parents[2]

SUMMARY = {"interval_id": "20260101T000000Z_20260101T010000Z", "fetched_total": 12,
           "decode": {"decoded": 11, "quarantined": 1, "per_reason": {"bad_snappy": 1}},
           "dedupe": {"output": 9, "duplicates": 2}, "lag_seconds": 42.5}


def test_interval_metrics_reach_statsd_on_airflow_2(tmp_path):
    listener = StatsdListener()
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
           "AIRFLOW__METRICS__STATSD_PORT": str(listener.port), "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True"}
    code = ("import json, sys; from airflow_provider_plgd.etl.metrics import emit_interval_metrics; "
            "print(json.dumps(emit_interval_metrics(json.loads(sys.argv[1]), dag_id='etl', stream='EVENTS')))")
    try:
        done = subprocess.run([sys.executable, "-c", code, json.dumps(SUMMARY)], env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        for _ in range(50):
            if "plgd.interval.lag_seconds" in listener.metrics():
                break
            time.sleep(0.1)
    finally:
        listener.stop()
    got = {k: v[:2] for k, v in listener.metrics().items()}
    assert got == {"plgd.interval.fetched": (12, "c"), "plgd.interval.decoded": (11, "c"),
                   "plgd.interval.quarantined": (1, "c"), "plgd.interval.quarantined_reason.bad_snappy": (1, "c"),
                   "plgd.interval.kept": (9, "c"), "plgd.interval.duplicates": (2, "c"),
                   "plgd.interval.lag_seconds": (42.5, "g")}, listener.lines
    assert listener.metrics()["plgd.interval.kept"][2] == {"dag_id": "etl", "stream": "EVENTS"}
