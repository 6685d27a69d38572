"""Helpers of the fetch-side fault tests (test_faults_nats.py, test_faults_nats_subjects.py) and
test_ledger.py: run the fetch operator, read what staging committed, the expected sequences from
the ground truth, wait, and publish raw bytes with the NATS text protocol.
"""

from __future__ import annotations

import time

from airflow_provider_plgd.operators.jetstream_to_staging import JetStreamToStagingOperator
from airflow_provider_plgd.plgd.subjects import subject_filters, subject_matches
from tests.integration.delta_read import staging_batches

O1 = "e1407479-3136-56c0-9908-bb02fb0339e2"




def run_op(**kwargs):
    kwargs.setdefault("task_id", "fetch")
    return JetStreamToStagingOperator(**kwargs).execute({"params": {}})


def committed(root: str, interval_id: str | None = None) -> dict[tuple[str, str], list[int]]:
    """``{(owner, event type): [stream_seq, …]}`` of the staging table (deltalake), in stream order."""
    return {(o, e): [r["stream_seq"] for r in rows]
            for (o, e, _i), rows in staging_batches(root, interval_id=interval_id).items()}


def expected(truth: dict, owner: str, event_type: str, start_ns: int, end_ns: int) -> list[int]:
    if event_type == "_unknown":  # no message of the test traffic has an unknown type
        return []
    return sorted(s for s, (subj, ts, _h, _d) in truth.items()
                  if any(subject_matches(f, subj) for f in subject_filters(owner, event_type))
                  and start_ns <= ts < end_ns)



def _wait(predicate, timeout=15.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def raw_publish(server, subject: bytes, payload: bytes, header_lines: bytes = b"") -> None:
    """Publish with the NATS text protocol on a plain socket (``PUB <subject> <n>``, or ``HPUB``
    with ``header_lines``), bytes as given."""
    import socket

    if header_lines:
        head = b"NATS/1.0\r\n" + header_lines + b"\r\n"
        command = b"HPUB " + subject + b" %d %d\r\n" % (len(head), len(head) + len(payload)) + head
    else:
        command = b"PUB " + subject + b" %d\r\n" % len(payload)
    with socket.create_connection((server.host, server.port), timeout=5) as sock:
        reader = sock.makefile("rb")
        assert reader.readline().startswith(b"INFO ")
        sock.sendall(b'CONNECT {"verbose":false,"pedantic":false,"headers":true}\r\n'
                     + command + payload + b"\r\nPING\r\n")
        assert reader.readline() == b"PONG\r\n"
