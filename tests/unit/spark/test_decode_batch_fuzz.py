"""Hypothesis fuzzing of ``airflow_provider_plgd.spark.decode_batch`` (the decode application's pure-Python core).

A staging batch (``airflow_provider_plgd.tables.staging.SCHEMA``) is built from simulator messages,
each either kept valid or mutated: truncated, bit-flipped, replaced by random bytes, emptied,
moved to another subject, given a broken subject, or given a ``Nats-Msg-Id`` header. Properties
(docs/reliability.md, "Bad input"):

* one output row per input row: the output ``stream_seq`` values are exactly the input ones
  (nothing lost, nothing doubled), and ``fetched == decoded + quarantined``, also summed over
  ``decode_batch_parts``;
* every quarantined row has a codec reason (``DECODE_ERROR_REASONS``, never ``internal_error``),
  a non-empty ``detail``, ``stage == "decode"``, and the raw payload, subject and headers
  unchanged;
* every row left valid decodes to its simulated event type and message ID (the header when set).

Deterministic: ``derandomize=True``, no example database.
"""

from __future__ import annotations

import random
from collections import Counter
from datetime import datetime, timezone
from functools import lru_cache

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_plgd.plgd.codec import DECODE_ERROR_REASONS
from airflow_provider_plgd.spark.decode_batch import decode_batch, decode_batch_parts
from airflow_provider_plgd.tables import staging

INTERVAL = "20260101T000000Z_20260101T010000Z"
PUBLISHED = datetime(2026, 1, 1, 0, 10, tzinfo=timezone.utc)
MUTATIONS = ("valid", "truncate", "bitflip", "random", "empty", "other_subject", "bad_subject", "header")
FUZZ = settings(max_examples=60, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@lru_cache(maxsize=1)
def sim_messages():
    from airflow_provider_plgd.simulator import SimulationConfig, generate

    sim = generate(SimulationConfig(seed=7, owners=2, devices_per_owner=2, resources_per_device=2, intervals=1,
                                    steps_per_interval=20, leadrt="first", old_hub_snapshots=True,
                                    unregister=True))
    return [m for m in sim.messages if m.fault != "corrupt"]


def build(rows):
    """rows: ``[(message index, mutation, seed)]`` -> (staging RecordBatch, expectations by seq)."""
    msgs = sim_messages()
    cols = {n: [] for n in staging.SCHEMA.names}
    expect = {}
    for seq, (i, mutation, seed) in enumerate(rows, start=1):
        m = msgs[i % len(msgs)]
        rng = random.Random(seed)
        subject, data, headers = m.subject, m.data, None
        if mutation == "truncate":
            data = data[: rng.randrange(len(data))]
        elif mutation == "bitflip":
            buf = bytearray(data)
            for _ in range(rng.randint(1, 6)):
                bit = rng.randrange(len(buf) * 8)
                buf[bit // 8] ^= 1 << (bit % 8)
            data = bytes(buf)
        elif mutation == "random":
            data = rng.randbytes(rng.randrange(0, 120))
        elif mutation == "empty":
            data = b""
        elif mutation == "other_subject":
            subject = msgs[(i + 1 + rng.randrange(len(msgs) - 1)) % len(msgs)].subject
        elif mutation == "bad_subject":
            subject = rng.choice(["", "plgd", "plgd.owners", "x.y.z", subject + ".extra.>", subject.replace(".", "..", 1),
                                  subject.rsplit(".", 1)[0] + ".nosuchevent"])
        elif mutation == "header":
            headers = {"Nats-Msg-Id": f"hdr-{seq}", "X-Fuzz": str(seed)}
        cols["stream"].append("EVENTS")
        cols["stream_seq"].append(seq)
        cols["subject"].append(subject)
        cols["published_at"].append(PUBLISHED)
        cols["msg_id"].append(headers["Nats-Msg-Id"] if headers else None)
        cols["headers"].append(list(headers.items()) if headers else None)
        cols["data"].append(data)
        expect[seq] = (mutation, m, subject, data, headers)
    batch = pa.RecordBatch.from_arrays([pa.array(cols[f.name], f.type) for f in staging.SCHEMA],
                                       schema=staging.SCHEMA)
    return batch, expect


row = st.tuples(st.integers(0, 10_000), st.sampled_from(MUTATIONS), st.integers(0, 2**32))


@FUZZ
@given(rows=st.lists(row, min_size=0, max_size=60))
def test_fetched_equals_decoded_plus_quarantined(rows):
    batch, expect = build(rows)
    out = decode_batch(batch, INTERVAL)
    parts = decode_batch_parts(batch, INTERVAL)
    assert out.num_rows == batch.num_rows == sum(p.num_rows for p in parts)
    result = out.to_pylist()
    assert sorted(r["stream_seq"] for r in result) == list(range(1, len(rows) + 1))  # none lost, none doubled
    decoded = [r for r in result if r["reason"] is None]
    quarantined = [r for r in result if r["reason"] is not None]
    assert len(decoded) + len(quarantined) == len(rows)
    for r in quarantined:
        mutation, m, subject, data, headers = expect[r["stream_seq"]]
        assert r["reason"] in DECODE_ERROR_REASONS, (r["reason"], r["detail"])
        assert r["detail"] and r["stage"] == "decode" and r["interval_id"] == INTERVAL
        assert (r["subject"], r["data"]) == (subject, data) and mutation != "valid"
        assert (dict(r["headers"]) if r["headers"] else None) == headers
        assert r["event_type"] is None and r["msg_id"] == (headers or {}).get("Nats-Msg-Id")
    for r in decoded:
        mutation, m, subject, data, headers = expect[r["stream_seq"]]
        assert r["subject"] == subject and r["interval_id"] == INTERVAL and r["event_type"]
        if mutation in ("valid", "header"):
            assert r["event_type"] == m.event_type
            assert r["msg_id"] == (headers["Nats-Msg-Id"] if headers else m.msg_id)
    # the mutations that can never decode are always quarantined, with the expected reasons
    by_seq = {r["stream_seq"]: r for r in result}
    for seq, (mutation, *_) in expect.items():
        if mutation == "empty":
            assert by_seq[seq]["reason"] in ("bad_protobuf", "bad_snappy"), by_seq[seq]["detail"]
        if mutation in ("valid", "header"):
            assert by_seq[seq]["reason"] is None


def test_every_mutation_kind_is_exercised_and_reasons_reconcile():
    """A fixed large batch: counts per reason add up, and most reasons occur."""
    rng = random.Random(1)
    rows = [(rng.randrange(10_000), MUTATIONS[k % len(MUTATIONS)], rng.randrange(2**32)) for k in range(800)]
    batch, _expect = build(rows)
    result = decode_batch(batch, INTERVAL).to_pylist()
    reasons = Counter(r["reason"] for r in result if r["reason"] is not None)
    decoded = sum(1 for r in result if r["reason"] is None)
    assert decoded + sum(reasons.values()) == len(rows)
    assert set(reasons) <= DECODE_ERROR_REASONS
    assert {"bad_protobuf", "bad_subject", "subject_mismatch", "bad_snappy"} <= set(reasons), reasons
    assert decoded >= 2 * len(rows) // len(MUTATIONS)  # valid + header rows at least
