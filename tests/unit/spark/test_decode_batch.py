"""Unit tests of airflow_provider_plgd.spark.decode_batch: staging RecordBatch -> union RecordBatch (no Spark).

Messages are built with the codec (``airflow_provider_plgd.plgd.codec``) with every field set to a
non-default value, so each output column is checked against what was published. Corrupt rows
must come out as quarantine rows with the right reason.
"""

from __future__ import annotations

import hashlib
import json
from datetime import date

import pyarrow as pa
import pyarrow.parquet
import pytest

from airflow_provider_plgd.plgd import codec
from airflow_provider_plgd.plgd.event_types import EVENT_TYPES
from airflow_provider_plgd.plgd.pb import resourceaggregate_pb2 as ra
from airflow_provider_plgd.spark import schemas
from airflow_provider_plgd.spark.decode_batch import decode_batch, decode_batch_parts, decode_batches
from airflow_provider_plgd.tables import staging

# tests/integration/test_decode_app.py loads all_cases, OWNER and _corrupt_rows from this file
from tests.unit.spark.decode_cases import (
    INTERVAL,
    OWNER,
    PUBLISHED,
    RID,
    TS0,
    TYPES,
    _corrupt_rows,
    _subject,
    ac,
    all_cases,
    content,
    em,
    rows_by_seq,
    staging_batch,
)


def test_every_event_type_every_field():
    cases = all_cases()
    assert {c[0] for c in cases} == set(EVENT_TYPES)
    batch = staging_batch([(subject, data) for _, subject, data, _ in cases])
    out = decode_batch(batch, INTERVAL)
    assert out.schema == schemas.UNION_SCHEMA
    assert out.num_rows == batch.num_rows
    got = rows_by_seq(out)
    for seq, (event_type, subject, data, cols) in enumerate(cases, start=1):
        row = got[seq]
        assert row["reason"] is None, (event_type, row["detail"])
        expected = {name: None for name in schemas.UNION_COLUMNS}
        expected.update(
            stream="EVENTS", stream_seq=seq, published_at=PUBLISHED, subject=subject, owner_id=OWNER,
            event_type=event_type, interval_id=INTERVAL, date=date(2026, 1, 1),
        )
        expected.update(cols)
        if "content_data" in cols:
            expected["content_json"] = row["content_json"]
            assert json.loads(row["content_json"]) == {"power": 5, "state": True}, event_type
        if cols.get("aggregate_id"):
            expected["msg_id"] = f"ra:{cols['aggregate_id']}:{cols['version']}:{event_type}:{cols['timestamp']}"
        else:
            expected["msg_id"] = "is:" + hashlib.sha256(subject.encode() + b"\n" + data).hexdigest()
        _fix_nested_json(row, expected)
        for name in schemas.UNION_COLUMNS:
            assert row[name] == expected[name], (event_type, name, row[name], expected[name])


def _fix_nested_json(row: dict, expected: dict) -> None:
    """content_json inside snapshot structs: check it parses to the CBOR content, then compare the rest."""
    snap = row.get("resource_snapshot")
    if snap is None:
        return
    items = [snap["latest_resource_change"]] + [p for k in ("create", "retrieve", "update", "delete")
                                                for p in snap[f"{k}_pendings"]]
    exp_snap = expected["resource_snapshot"]
    exp_items = [exp_snap["latest_resource_change"]] + [p for k in ("create", "retrieve", "update", "delete")
                                                        for p in exp_snap[f"{k}_pendings"]]
    for got, exp in zip(items, exp_items, strict=True):
        if exp.get("content_data") is not None:
            assert json.loads(got["content_json"]) == {"power": 5, "state": True}
            exp["content_json"] = got["content_json"]


def test_leadrt_subject_and_header_msg_id():
    _, _, data, _ = next(c for c in all_cases() if c[0] == "resourcechanged")
    lead_subject = _subject("resourcechanged", leadrt=True)
    batch = staging_batch([(lead_subject, data), (_subject("resourcechanged"), data, "header-id-1")])
    got = rows_by_seq(decode_batch(batch, INTERVAL))
    assert got[1]["lead_resource_type"] == "core.light"
    assert got[1]["subject"] == lead_subject
    assert got[1]["msg_id"].startswith("ra:")
    assert got[2]["lead_resource_type"] is None
    assert got[2]["msg_id"] == "header-id-1"  # header wins
    assert got[2]["headers"] is None and got[2]["data"] is None  # raw columns only on quarantine rows



def test_corrupt_rows_are_quarantined_with_reason():
    good = [(s, d) for _, s, d, _ in all_cases()[:3]]
    corrupt = _corrupt_rows()
    rows = good[:1] + [r for _, r in corrupt] + good[1:]
    batch = staging_batch(rows)
    out = decode_batch(batch, INTERVAL)
    assert out.num_rows == len(rows)
    got = rows_by_seq(out)
    raw = rows_by_seq(batch)
    for k, (reason, _row_in) in enumerate(corrupt):
        seq = k + 2
        row = got[seq]
        assert row["reason"] == reason, (reason, row["detail"])
        assert row["detail"], reason
        assert row["stage"] == "decode"
        assert row["interval_id"] == INTERVAL
        for col in ("stream", "stream_seq", "subject", "published_at", "msg_id", "data"):
            assert row[col] == raw[seq][col], (reason, col)
        assert (row["headers"] or None) == (raw[seq]["headers"] or None)
        for col in schemas.EVENTS_COLUMNS:
            if col not in schemas.QUARANTINE_COLUMNS:
                assert row[col] is None, (reason, col)
    assert got[1]["msg_id"] != "hdr-q1"
    assert got[2]["msg_id"] == "hdr-q1" and got[2]["headers"] == [("Nats-Msg-Id", "hdr-q1")]
    decoded = [r for r in got.values() if r["reason"] is None]
    assert len(decoded) == len(good)


def test_parts_and_iterator_keep_every_row():
    cases = all_cases()
    rows = [(s, d) for _, s, d, _ in cases] + [r for _, r in _corrupt_rows()]
    batch = staging_batch(rows)
    parts = decode_batch_parts(batch, INTERVAL)
    assert sum(p.num_rows for p in parts) == batch.num_rows
    assert all(p.schema == schemas.UNION_SCHEMA for p in parts)
    # one part per (event type) plus one quarantine part
    assert len(parts) == len(EVENT_TYPES) + 1
    seqs = sorted(s for p in decode_batches([batch.slice(0, 5), batch.slice(5)], INTERVAL)
                  for s in p.column("stream_seq").to_pylist())
    assert seqs == list(range(1, batch.num_rows + 1))


def test_empty_batch():
    out = decode_batch(pa.RecordBatch.from_pylist([], schema=staging.SCHEMA), INTERVAL)
    assert out.num_rows == 0 and out.schema == schemas.UNION_SCHEMA


def test_uint64_wraps_and_unknown_enum_is_kept_as_number():
    msg = ra.ResourceChanged(resource_id=RID, content=content(), status=99, audit_context=ac(),
                             event_metadata=ra.EventMetadata(version=2**63 + 1, timestamp=TS0, sequence=2**64 - 1),
                             resource_types=TYPES)
    data = codec.encode_resource_aggregate_event("resourcechanged", msg)
    row = decode_batch(staging_batch([(_subject("resourcechanged"), data)]), INTERVAL).to_pylist()[0]
    assert row["reason"] is None
    assert row["status"] == "99"
    assert row["sequence"] == -1
    assert row["version"] == -(2**63) + 1


def test_empty_content_and_defaults():
    msg = ra.ResourceChanged(resource_id=RID, content=ra.Content(coap_content_format=-1), status=ra.NOT_FOUND,
                             event_metadata=em(0))
    data = codec.encode_resource_aggregate_event("resourcechanged", msg)
    row = decode_batch(staging_batch([(_subject("resourcechanged"), data)]), INTERVAL).to_pylist()[0]
    assert row["reason"] is None
    assert row["content_type"] == "" and row["coap_content_format"] == -1 and row["content_data"] == b""
    assert row["content_json"] is None
    assert row["resource_types"] == [] and row["etag"] == b"" and row["user_id"] == ""
    assert row["version"] == 0


def test_snapshot_without_latest_change_is_null_struct():
    snap = ra.ResourceStateSnapshotTaken(resource_id=RID, event_metadata=em(3))
    data = codec.encode_resource_aggregate_event("resourcestatesnapshottaken", snap)
    row = decode_batch(staging_batch([(_subject("resourcestatesnapshottaken"), data)]), INTERVAL).to_pylist()[0]
    assert row["reason"] is None
    assert row["resource_snapshot"]["latest_resource_change"] is None
    assert row["resource_snapshot"]["create_pendings"] == []


def test_spark_schemas_convert():
    pytest.importorskip("pyspark")
    union = schemas.union_spark_schema()
    assert union.fieldNames() == list(schemas.UNION_COLUMNS)
    assert union["published_at"].dataType.typeName() == "timestamp"
    assert schemas.quarantine_spark_schema().fieldNames() == list(schemas.QUARANTINE_COLUMNS)
