"""Smoke test of ``make demo``: simulator → nats-server → plgd_events_etl via ``airflow dags test`` → snapshot.

Runs the demo driver (``python -m plgd_devtools.demo``) in a subprocess with a small
configuration: a real nats-server, ``airflow db migrate`` on SQLite, one ``airflow dags test``
for one data interval (real ``spark-submit`` in ``local[*]``). Then checks the committed outputs:
the snapshot equals the simulator's ground truth, the fetched count equals decoded +
quarantined, and every published message was fetched. Several intervals, the scheduler and
backfills are covered by ``test_backfill.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_plgd.tables.layout import Layout

pytestmark = [pytest.mark.spark, pytest.mark.airflow]


def test_demo_one_interval_through_airflow_dags_test(tmp_path: Path) -> None:
    from airflow_provider_plgd.tables.run_summary import read_app_summary
    from plgd_devtools.snapshot_compare import read_latest_tables

    work = tmp_path / "demo"
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "plgd_devtools.demo", "--owners", "2", "--devices", "2",
         "--resources", "2", "--intervals", "1", "--interval-seconds", "6", "--steps", "40",
         "--workdir", str(work)],
        env=env, capture_output=True, text=True, timeout=1200,
    )
    log = (work / "demo.log").read_text(errors="replace") if (work / "demo.log").exists() else ""
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:] + log[-6000:]
    assert "equals the simulator's ground truth" in proc.stdout

    data = work / "data"
    tables = read_latest_tables(str(data))
    summary = json.loads((work / "ground_truth" / "summary.json").read_text())
    owner_ids = {o["owner_id"] for o in summary["owners"]}
    assert {row["owner_id"] for row in tables["owner_devices"]} <= owner_ids
    assert tables["owner_devices"] and tables["resources"] and tables["device_metadata"] and tables["device_links"]

    # Counts reconcile per interval (fetched == decoded + quarantined), and over the run every
    # published message was fetched once and every corrupt one was quarantined.
    intervals = sorted(p.name.removeprefix("interval=").removesuffix(".json")
                       for p in (data / "_runs" / "decode").glob("interval=*.json"))
    assert len(intervals) == 1
    fetched = quarantined = 0
    for interval_id in intervals:
        decode = read_app_summary(Layout.of(str(data)), "decode", interval_id)
        assert decode["fetched"] == decode["decoded"] + decode["quarantined"]
        fetched += decode["fetched"]
        quarantined += decode["quarantined"]
    assert fetched == summary["messages"]
    assert quarantined == summary["corrupt"]["total"]
