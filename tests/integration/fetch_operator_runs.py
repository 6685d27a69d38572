"""Traffic, expected rows and the operator run of the fetch-operator tests (test_fetch_operator.py,
test_fetch_operator_faults.py): expected stream sequences per owner x event type x interval from the
ground truth, and what the staging table committed.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from airflow_provider_plgd.operators.jetstream_to_staging import JetStreamToStagingOperator
from airflow_provider_plgd.plgd.subjects import (
    metadata_subject,
    registrations_subject,
    resource_subject,
    subject_filters,
    subject_matches,
)
from airflow_provider_plgd.tables import staging
from airflow_provider_plgd.tables.layout import Layout
from tests.integration.delta_read import staging_rows

O1 = "e1407479-3136-56c0-9908-bb02fb0339e2"
O2 = "6ba7b811-9dad-11d1-80b4-00c04fd430c8"
EVENT_TYPES = ["devicesregistered", "devicemetadataupdated", "resourcechanged"]
DEV = "00000000-0000-0000-0000-000000000001"
HREF = "78baefb2-dcdc-50c3-bb55-5ff4c5e4c8b2"


def make_messages(tag: str, n_per_kind: int = 20) -> list[tuple]:
    """Messages of two owners, three event types, and all resource subject forms (S4, S5, S6)."""
    out = []
    for i in range(n_per_kind):
        for owner in (O1, O2):
            hdr = {"Nats-Msg-Id": f"{tag}-{owner[:4]}-{i}"} if i % 5 == 0 else None
            out.append((registrations_subject(owner, "devicesregistered"), f"{tag}-reg-{owner}-{i}".encode(), hdr))
            out.append((metadata_subject(owner, DEV, "devicemetadataupdated"), f"{tag}-md-{i}".encode() * 3, None))
            lead = [dict(), dict(leadrt=True), dict(lead_resource_type="core.light")][i % 3]
            out.append((resource_subject(owner, DEV, HREF, "resourcechanged", **lead), os.urandom(50 + i), None))
            out.append((resource_subject(owner, DEV, HREF, "resourcechanged"), f"{tag}-rc-{i}".encode(), None))
    return out


def expected_seqs(truth: dict, owner: str, event_type: str, start_ns: int, end_ns: int, last_seq: int | None = None):
    """Stream sequences of one owner x event type in [start_ns, end_ns), over its filters, in stream order."""
    if event_type == "_unknown":  # no message of the test traffic goes there
        return []
    return sorted(seq for seq, (subj, ts, _h, _d) in truth.items()
                  if any(subject_matches(f, subj) for f in subject_filters(owner, event_type))
                  and start_ns <= ts < end_ns and (last_seq is None or seq <= last_seq))


def batch_rows(root, owner: str, event_type: str, interval_id: str | None = None) -> list[dict]:
    """The committed rows of one (owner, event type) batch (deltalake), in stream order."""
    return [r for r in staging_rows(root, interval_id=interval_id) if (r["owner_id"], r["event_type"]) == (owner, event_type)]


def committed_seqs(root, owner: str, event_type: str, interval_id: str | None = None) -> list[int]:
    return [r["stream_seq"] for r in batch_rows(root, owner, event_type, interval_id)]


def file_digests(root) -> list[str]:
    """SHA-256 of each data file the staging table's log names, sorted (file names differ per run)."""
    return sorted(hashlib.sha256(Path(f.url).read_bytes()).hexdigest() for f in staging.staged_files(Layout.of(root), "EVENTS"))


def run_op(**kwargs):
    kwargs.setdefault("task_id", "fetch")
    return JetStreamToStagingOperator(**kwargs).execute({"params": {}})
