"""Traffic, the plan step's ledger write, the fetch of every range and an interval around the stored
messages: shared by the ledger tests (test_ledger.py, test_ledger_dag.py) against the real server;
test_ledger.py re-exports them (test_s3_root.py and test_faults_fetch.py import them from there).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

from airflow_provider_plgd import times
from airflow_provider_plgd.plgd.subjects import registrations_subject, resource_subject
from airflow_provider_plgd.tables.layout import Layout
from tests.integration.conftest import read_stream

UTC = timezone.utc
O1 = "6ba7b811-9dad-11d1-80b4-00c04fd430c8"
O2 = "e1407479-3136-56c0-9908-bb02fb0339e2"
DEV = "00000000-0000-0000-0000-000000000001"
HREF = "78baefb2-dcdc-50c3-bb55-5ff4c5e4c8b2"


def run_op(**kwargs):
    from airflow_provider_plgd.operators.jetstream_to_staging import JetStreamToStagingOperator

    kwargs.setdefault("task_id", "fetch")
    return JetStreamToStagingOperator(**kwargs).execute({"params": {}})


def traffic(n: int) -> list[tuple]:
    """``n`` messages per owner on valid subjects (payload content does not matter to the fetch)."""
    out = []
    for i in range(n):
        for owner in (O1, O2):
            out.append((registrations_subject(owner, "devicesregistered"), f"r{i}".encode(), None))
            out.append((resource_subject(owner, DEV, HREF, "resourcechanged"), f"c{i}".encode(), None))
    return out


def plan_ledger(root: str, start_ns: int, end_ns: int, owners: list[str] | None = None,
                accept_fewer: bool = False, max_ranges: int = 1, range_messages: int = 100_000,
                event_types: tuple[str, ...] = ("devicesregistered", "resourcechanged")) -> dict:
    """The ETL plan step's ledger write (``etl.write_interval_ledger``) against the real server."""
    from airflow_provider_plgd.etl import write_interval_ledger
    from airflow_provider_plgd.hooks.jetstream import JetStreamHook

    start, end = (datetime.fromtimestamp(ns / 1e9, tz=UTC) for ns in (start_ns, end_ns))
    return write_interval_ledger(JetStreamHook(), Layout.of(root), times.Interval.of(start, end), owners, list(event_types),
                                 accept_fewer=accept_fewer, max_ranges=max_ranges, range_messages=range_messages)


def fetch_ranges(root: str, record: dict) -> list[dict]:
    """Run the fetch task of every range of a plan record (the ETL's mapped ``fetch``)."""
    base = Layout.of(root).ledger_interval_dir(record["stream"], record["interval_id"])
    return [run_op(ledger_range=str(i), ledger=base, storage_root=root) for i in range(record["fetch_ranges"])]


def bounds_around(url: str) -> tuple[int, int]:
    """An interval that holds every stored message (whole seconds around the first and last)."""
    truth = read_stream(url)
    times = [t for _s, t, _h, _d in truth.values()]
    start, end = (min(times) // 10**9) * 10**9, (max(times) // 10**9 + 1) * 10**9
    while time.time_ns() < end + 50_000_000:  # complete on the server's clock (the fetch checks it)
        time.sleep(0.05)
    return start, end
