"""Fault injection on the fetch side, continued: a message on a subject that is not valid UTF-8 (a raw
PUB), a dead client read loop, a durable consumer's retry within ``ack_wait``, and a durable consumer
of an earlier version. Ground truth is read independently of the hook (``conftest.read_stream``).
Sections of docs/reliability.md: "Failures: NATS, Spark and Airflow", "Exactly-once output".
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from airflow_provider_plgd import times
from airflow_provider_plgd.plgd.subjects import registrations_subject
from airflow_provider_plgd.tables import staging_commits
from tests.integration.conftest import publish_messages, read_stream
from tests.integration.delta_read import staging_batches, staging_rows
from tests.integration.fetch_faults import O1, _wait, raw_publish, run_op

pytestmark = pytest.mark.airflow

# ---------------------------------------------------------------------------------------------
# A message on a subject that is not valid UTF-8 (raw PUB by any client allowed on plgd.>)
# ---------------------------------------------------------------------------------------------


def stored_messages(url: str, last_seq: int) -> dict[int, tuple[str, bytes]]:
    """``{seq: (subject, data)}`` by ``$JS.API.STREAM.MSG.GET`` (the server's JSON: invalid UTF-8
    in a subject shows as U+FFFD), independent of the pull path under test."""
    import asyncio
    import base64
    import json

    import nats

    async def read():
        nc = await nats.connect(url)
        try:
            out = {}
            for seq in range(1, last_seq + 1):
                answer = json.loads((await nc.request("$JS.API.STREAM.MSG.GET.EVENTS",
                                                      json.dumps({"seq": seq}).encode(), timeout=5)).data)
                msg = answer["message"]
                out[seq] = (msg["subject"], base64.b64decode(msg.get("data") or ""))
            return out
        finally:
            await nc.close()

    return asyncio.run(read())


def test_message_on_a_non_utf8_subject_is_staged_and_blocks_no_fetch(jetstream, storage_root):
    """Before: nats-py's read loop died on the subject (UnicodeDecodeError, only a traceback), and
    every fetch of the owner failed after ~43 s with JetStreamTimeoutError. Now the per-filter,
    owner-wide and durable paths all finish at once and stage the message, its subject with U+FFFD
    for each invalid byte (decode quarantines it) and its payload unchanged."""
    from airflow_provider_plgd.hooks.jetstream import JetStreamHook
    from airflow_provider_plgd.plgd.subjects import resource_subject

    dev, href = "00000000-0000-0000-0000-000000000001", "78baefb2-dcdc-50c3-bb55-5ff4c5e4c8b2"
    good = [(registrations_subject(O1, "devicesregistered"), b"reg", None),
            (resource_subject(O1, dev, href, "resourcechanged"), b"changed", None)]
    publish_messages(jetstream.url, good)
    raw_publish(jetstream, f"plgd.owners.{O1}.".encode() + b"\xff\xfe", b"junk")  # the example
    raw_publish(jetstream, f"plgd.owners.{O1}.devices.".encode() + b"\xff\xfe"
                + f".resources.{href}.resourcechanged".encode(), b"payload of a bad subject",
                header_lines=b"X-Bad: \xff\xfe\r\n")  # nats-py's header parser replaces those bytes itself
    publish_messages(jetstream.url, good)
    hook = JetStreamHook()
    _wait(lambda: hook.stream_info()["state"]["messages"] == 6, what="the raw PUBs stored")
    truth = stored_messages(jetstream.url, 6)
    bad_subject = f"plgd.owners.{O1}.devices.\ufffd\ufffd.resources.{href}.resourcechanged"
    assert truth[3][0] == f"plgd.owners.{O1}.\ufffd\ufffd" and truth[4] == (bad_subject, b"payload of a bad subject")

    started = time.monotonic()
    single = run_op(owner_id=O1, event_type="resourcechanged", start_seq=1, storage_root=f"{storage_root}/single")
    grouped = run_op(owner_ids=[O1], event_types=["devicesregistered", "resourcechanged"], start_seq=1,
                     storage_root=f"{storage_root}/grouped")
    durable = run_op(owner_id=O1, event_type="resourcechanged", durable="plgd_non_utf8", ack_wait_seconds=5.0,
                     storage_root=f"{storage_root}/durable")
    assert time.monotonic() - started < 20  # was: ~43 s per attempt, then JetStreamTimeoutError

    want = [(seq, truth[seq][0], truth[seq][1]) for seq in (2, 4, 6)]
    # the grouped (owner-wide) read also stages the owner's message whose type token is not UTF-8, as
    # the owner's _unknown batch (decode quarantines it): 2 registered + 3 changed + 1 unknown
    assert single["count"] == durable["count"] == 3 and grouped["count"] == 6
    for where in ("single", "grouped", "durable"):
        rows = [r for r in staging_rows(f"{storage_root}/{where}") if r["event_type"] == "resourcechanged"]
        assert [(r["stream_seq"], r["subject"], r["data"]) for r in rows] == want
        assert rows[1]["headers"] == [("X-Bad", "\ufffd\ufffd")]
    assert [r["stream_seq"] for r in staging_rows(f"{storage_root}/grouped")
            if r["event_type"] == "devicesregistered"] == [1, 5]
    assert [(r["stream_seq"], r["subject"]) for r in staging_rows(f"{storage_root}/grouped")
            if r["event_type"] == "_unknown"] == [(3, truth[3][0])]
    assert durable["interval_id"] == times.durable_interval_id(2, 6)


def test_a_dead_client_read_loop_fails_the_fetch_at_once_naming_the_cause(jetstream, storage_root, monkeypatch):
    """Second line of defence: whatever ends nats-py's read loop (here the non-UTF-8 subject with
    the replacement switched off), the pull reader notices within a second and fails with
    JetStreamConnectionError instead of waiting ~43 s for answers nobody reads."""
    from airflow_provider_plgd.exceptions import JetStreamConnectionError
    from airflow_provider_plgd.hooks import jetstream as hook_module
    from airflow_provider_plgd.jetstream import client as client_module

    monkeypatch.setattr(client_module, "NON_UTF8_REPLACEMENT", "strict")
    publish_messages(jetstream.url, [(registrations_subject(O1, "devicesregistered"), b"reg", None)])
    raw_publish(jetstream, f"plgd.owners.{O1}.registrations.".encode() + b"\xff", b"junk")
    _wait(lambda: hook_module.JetStreamHook().stream_info()["state"]["messages"] == 2, what="the raw PUB stored")
    started = time.monotonic()
    with pytest.raises(JetStreamConnectionError, match="read loop ended"):
        run_op(owner_ids=[O1], event_types=["devicesregistered", "resourcechanged"], start_seq=1,
               storage_root=storage_root)
    assert time.monotonic() - started < 10
    assert staging_rows(storage_root) == []


# ---------------------------------------------------------------------------------------------
# Durable consumer: a retry within ack_wait must not acknowledge the failed attempt's messages
# ---------------------------------------------------------------------------------------------
def test_durable_retry_within_ack_wait_loses_no_message(jetstream, storage_root, monkeypatch):
    """Run 1 pulls 1..12 and fails before its commit; the immediate retry pulls 13..24 and commits.
    With ack policy "all" its ack of 24 also acknowledged 1..12, never staged. Now each staged
    message is acknowledged by itself: 1..12 come again after ack_wait, every message is staged."""
    from airflow_provider_plgd.plgd.subjects import resource_subject

    dev, href = "00000000-0000-0000-0000-000000000001", "78baefb2-dcdc-50c3-bb55-5ff4c5e4c8b2"
    messages = []
    for i in range(20):  # both filters of a resource type: S4 and the .leadrt form
        messages.append((resource_subject(O1, dev, href, "resourcechanged"), f"s4-{i}".encode(), None))
        messages.append((resource_subject(O1, dev, href, "resourcechanged", leadrt=True), f"s5-{i}".encode(), None))
    publish_messages(jetstream.url, messages)
    truth = read_stream(jetstream.url)
    kw = dict(owner_id=O1, event_type="resourcechanged", storage_root=storage_root, durable="plgd_faults_retry",
              max_messages=12, ack_wait_seconds=2.0)

    real_commit = staging_commits.commit_batches

    def failing_commit(*args, **kwargs):
        raise OSError("injected: the first attempt dies before its commit")

    monkeypatch.setattr(staging_commits, "commit_batches", failing_commit)
    with pytest.raises(OSError, match="injected"):
        run_op(**kw)  # run 1: pulls 1..12
    monkeypatch.setattr(staging_commits, "commit_batches", real_commit)
    retry = run_op(**kw)  # the immediate retry (Airflow retry or manual rerun), within ack_wait
    assert (retry["first_seq"], retry["last_seq"], retry["count"]) == (13, 24, 12)
    time.sleep(2.5)  # ack_wait passed: 1..12 are redelivered
    for _ in range(10):
        if run_op(**kw)["count"] == 0:
            break
    batches = staging_batches(storage_root)
    staged = Counter(r["stream_seq"] for rows in batches.values() for r in rows)
    assert sorted(staged) == sorted(truth)  # every published message is in a committed durable batch
    assert max(staged.values()) == 1  # and here (no crash after a commit) exactly once
    for (_owner, _type, interval_id), rows in batches.items():  # in stream order, named by its sequence range
        seqs = [r["stream_seq"] for r in rows]
        assert seqs == sorted(seqs) and interval_id == times.durable_interval_id(seqs[0], seqs[-1])
        assert all(r["subject"] == truth[r["stream_seq"]][0] for r in rows)


def test_durable_consumer_of_earlier_versions_is_refused_with_the_way_to_switch(jetstream, storage_root):
    """A durable consumer with ack policy "all" (what earlier versions created) is refused before
    anything is read, acknowledged or written; the message names the ack floor and the fix."""
    import asyncio

    import nats
    from nats.js.api import AckPolicy, ConsumerConfig

    subj = registrations_subject(O1, "devicesregistered")
    publish_messages(jetstream.url, [(subj, f"m-{i}".encode(), None) for i in range(5)])

    async def old_consumer():
        nc = await nats.connect(jetstream.url)
        try:
            js = nc.jetstream()
            await js.add_consumer("EVENTS", ConsumerConfig(durable_name="plgd_old", ack_policy=AckPolicy.ALL,
                                                           filter_subject=subj, ack_wait=300.0))
            psub = await js.pull_subscribe_bind(durable="plgd_old", stream="EVENTS")
            msgs = await psub.fetch(3, timeout=5)
            await msgs[-1].ack_sync()  # ack floor 3
            return (await js.consumer_info("EVENTS", "plgd_old")).num_pending
        finally:
            await nc.close()

    assert asyncio.run(old_consumer()) == 2
    kw = dict(owner_id=O1, event_type="devicesregistered", storage_root=storage_root, durable="plgd_old")
    with pytest.raises(ValueError, match=r"has ack policy 'all'.*ack floor, stream sequence 3.*"
                                         r"nats consumer add EVENTS plgd_old --pull --ack explicit --deliver 4"):
        run_op(**kw)
    assert staging_rows(storage_root) == []
