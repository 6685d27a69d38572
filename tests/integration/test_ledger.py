"""The interval ledger through real parts: what the stream holds, and every stage accounting for it.

Real nats-server (``jetstream`` fixture), the fetch operator and the plan step against the real
server. Each test names the case of ``docs/reliability.md`` ("The interval ledger") it covers;
each failed on the code before the ledger. The ledger through the whole ETL DAG (real Airflow, Spark
Connect): test_ledger_dag.py.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from airflow_provider_plgd.exceptions import FewerMessagesError, LedgerError
from airflow_provider_plgd.plgd.subjects import registrations_subject, resource_subject
from airflow_provider_plgd.tables import ledger, staging
from airflow_provider_plgd.tables.layout import Layout
from plgd_devtools.nats_server import recreate_stream
from tests.integration.conftest import publish_messages, read_stream
from tests.integration.delta_read import staging_rows

# test_s3_root.py and test_faults_fetch.py import O1, O2, bounds_around, plan_ledger, run_op, traffic from here
from tests.integration.ledger_runs import DEV, HREF, O1, O2, bounds_around, fetch_ranges, plan_ledger, run_op, traffic


# ---------------------------------------------------------------------------------------------
# Case 3: a re-created stream must not blank good staging
# ---------------------------------------------------------------------------------------------
def test_rerun_after_the_stream_was_recreated_refuses_to_commit_fewer(jetstream, storage_root):
    publish_messages(jetstream.url, traffic(25))  # 50 per owner
    start_ns, end_ns = bounds_around(jetstream.url)
    kw = dict(owner_ids=[O1, O2], event_types=["devicesregistered", "resourcechanged"], storage_root=storage_root,
              start_time=start_ns, end_time=end_ns)
    plan_ledger(storage_root, start_ns, end_ns)
    first = run_op(**kw)
    assert first["count"] == 100
    before = staging_rows(storage_root)
    assert len(before) == 100

    recreate_stream(jetstream.url)  # a lost NATS volume, or `nats stream rm/add`
    with pytest.raises(FewerMessagesError, match=r"now holds 0 messages for owner .* but 50 are committed"):
        run_op(**kw)
    assert staging_rows(storage_root) == before  # untouched
    with pytest.raises(FewerMessagesError, match="was re-created"):
        plan_ledger(storage_root, start_ns, end_ns)
    assert staging_rows(storage_root) == before

    # asked for explicitly, the rerun replaces them
    plan_ledger(storage_root, start_ns, end_ns, accept_fewer=True)
    again = run_op(accept_fewer_messages="True", **kw)
    assert again["count"] == 0
    assert staging_rows(storage_root) == []


# ---------------------------------------------------------------------------------------------
# Case 4: decode reads exactly the rows the ledger recorded, from the staging table's log
# ---------------------------------------------------------------------------------------------
def test_decode_refuses_an_interval_whose_fetch_records_do_not_add_up(jetstream, storage_root):
    from airflow_provider_plgd.spark.decode_job import ledger_files

    publish_messages(jetstream.url, traffic(10))
    start_ns, end_ns = bounds_around(jetstream.url)
    record = plan_ledger(storage_root, start_ns, end_ns)
    interval = record["interval_id"]
    (out,) = fetch_ranges(storage_root, record)
    assert (out["count"], out["batches"], out["owners"], out["files"]) == (40, 4, 2, 2)  # 2 owners x 2 types
    assert out["record"].startswith(f"{storage_root}/_ledger/") and len(json.dumps(out)) < 1500  # small XCom
    files = ledger_files(Layout.of(storage_root), "EVENTS", interval)
    assert len(files) == 2 and {f.event_type for f in files} == {"devicesregistered", "resourcechanged"}
    assert sum(f.rows for f in files) == 40 == len(staging_rows(storage_root, interval_id=interval))
    path = f"{Layout.of(storage_root).ledger_interval_dir('EVENTS', interval)}/fetch/{ledger.range_record_name(0)}"
    good = ledger.read_ledger_file(path)
    assert good["event_types"]["resourcechanged"]["count"] == 20 and good["event_types"]["resourcechanged"]["batches"] == 2
    assert "owners" in good and not isinstance(good["owners"], dict)  # a number, nothing per owner

    # a record whose event types do not sum to what it says it staged (changed afterwards)
    doctored = json.loads(json.dumps(good))
    doctored["event_types"]["resourcechanged"]["count"] -= 1
    ledger.write_ledger_file(path, doctored)
    with pytest.raises(LedgerError, match=r"range 0: its event types hold 39 messages, its record says 40 staged"):
        ledger_files(Layout.of(storage_root), "EVENTS", interval)
    # a record that adds up but does not match the table's rows
    doctored["staged"] -= 1
    doctored["skipped"] = {"event_type_not_requested": 1}
    ledger.write_ledger_file(path, doctored)
    with pytest.raises(LedgerError, match=r"range 0, event type resourcechanged: the staging table holds 20 rows, "
                                          r"the fetch record 19"):
        ledger_files(Layout.of(storage_root), "EVENTS", interval)
    # a record of another run of the plan
    ledger.write_ledger_file(path, {**good, "run_version": good["run_version"] - 1})
    with pytest.raises(LedgerError, match=r"range 0: its fetch record is of the plan's run"):
        ledger_files(Layout.of(storage_root), "EVENTS", interval)
    ledger.write_ledger_file(path, good)
    assert len(ledger_files(Layout.of(storage_root), "EVENTS", interval)) == 2
    # staging rows the ledger does not name (another DAG's batch of the same interval ID) are refused
    run_op(owner_id=O1, event_type="devicesregistered", storage_root=storage_root, start_time=start_ns,
           end_time=end_ns)
    with pytest.raises(LedgerError, match=r"staging file .*/b\.[^ ]+ \(10 rows\) is not of a range of the plan's run"):
        ledger_files(Layout.of(storage_root), "EVENTS", interval)

    # a range the plan counted but no fetch task recorded
    ledger.clear_fetch_records(Layout.of(storage_root), "EVENTS", interval)
    with pytest.raises(LedgerError, match=r"range 0 \(sequences \[1, 41\)\): the stream holds 40 messages, "
                                          "no fetch task recorded it"):
        ledger_files(Layout.of(storage_root), "EVENTS", interval)


# ---------------------------------------------------------------------------------------------
# Case 9: deletes in the middle of the stream
# ---------------------------------------------------------------------------------------------
def test_deletes_in_the_middle_are_recorded_and_a_rerun_with_fewer_is_refused(jetstream, storage_root):
    import nats

    seqs = publish_messages(jetstream.url, traffic(10))
    start_ns, end_ns = bounds_around(jetstream.url)

    async def delete(seq_list):
        nc = await nats.connect(jetstream.url)
        try:
            for seq in seq_list:
                await nc.jetstream().delete_msg("EVENTS", seq)
        finally:
            await nc.close()

    asyncio.run(delete([seqs[3]]))  # e.g. max_msgs_per_subject or a single delete
    record = plan_ledger(storage_root, start_ns, end_ns, max_ranges=2, range_messages=10)
    assert record["total"] == 39 and record["deleted_in_range"] == 1
    assert record["first_seq"] == 1 and record["end_seq_exclusive"] == 41
    assert [(r["first_seq"], r["end_seq_exclusive"], r["count"]) for r in record["ranges"]] == [(1, 21, 19), (21, 41, 20)]
    assert sum(o["count"] for o in fetch_ranges(storage_root, record)) == 39

    asyncio.run(delete(seqs[10:14]))  # a purge in the middle of range 0
    with pytest.raises(FewerMessagesError, match=r"total: the stream now holds 35 messages of plgd.>, the ledger "
                                                 r"recorded 39"):
        plan_ledger(storage_root, start_ns, end_ns, max_ranges=2, range_messages=10)
    # a fetch that still uses the old ledger cannot account for its range either; range 1 still can
    with pytest.raises(LedgerError, match=r"range 0 \(sequences \[1, 21\)\): the stream holds 19 messages, "
                                          r"fetched 15"):
        fetch_ranges(storage_root, record)
    base = Layout.of(storage_root).ledger_interval_dir("EVENTS", record["interval_id"])
    assert run_op(ledger_range=1, ledger=base, storage_root=storage_root)["count"] == 20


# ---------------------------------------------------------------------------------------------
# fetch = staged + skipped, per owner, against the server's count
# ---------------------------------------------------------------------------------------------
def test_fetch_counts_skips_and_fails_when_the_stream_changes_under_it(jetstream, storage_root, monkeypatch):
    from airflow_provider_plgd.fetch import router as fetch_module

    publish_messages(jetstream.url, traffic(5))
    start_ns, end_ns = bounds_around(jetstream.url)
    out = run_op(owner_ids=[O1], event_types=["resourcechanged"], storage_root=storage_root,
                 start_time=start_ns, end_time=end_ns)
    assert out["count"] == 5 and out["skipped"] == {"event_type_not_requested": 5}

    # a message that the read does not see (here: the router loses one) fails the owner before any commit
    real_route = fetch_module.Router.route

    def lossy(self, batch):
        return real_route(self, batch[1:] if batch else batch)

    monkeypatch.setattr(fetch_module.Router, "route", lossy)
    other = storage_root + "/other"
    with pytest.raises(LedgerError, match=rf"owner {O1}: the stream holds 10 messages, fetched 9"):
        run_op(owner_ids=[O1], event_types=["resourcechanged"], storage_root=other,
               start_time=start_ns, end_time=end_ns)
    assert staging_rows(other) == []


def test_every_message_is_staged_once_across_ranges_owners_and_a_selection(jetstream, storage_root):
    """The ETL's fetch by stream-sequence ranges: owners spread across range boundaries, each
    range read by one task and committed as its own files, every message staged exactly once
    into its (owner, event type) batch; a selection of owners reads only theirs. Quiet owners
    have no row at all."""
    from airflow_provider_plgd.spark.decode_job import ledger_files

    o3 = "0f6c6a7e-0b1e-4c1b-9d0e-1a2b3c4d5e6f"
    extra = [(registrations_subject(o3, "devicesregistered"), b"x", None)]
    seqs = publish_messages(jetstream.url, traffic(6)[:13] + extra + traffic(6)[13:])  # 25 messages, 3 owners
    start_ns, end_ns = bounds_around(jetstream.url)
    truth = read_stream(jetstream.url)
    record = plan_ledger(storage_root, start_ns, end_ns, max_ranges=3, range_messages=5)
    assert record["fetch_ranges"] == 3 and [r["count"] for r in record["ranges"]] == [8, 8, 9]
    assert record["ranges"][0]["first_seq"] == 1 and record["ranges"][-1]["end_seq_exclusive"] == 26
    outs = fetch_ranges(storage_root, record)
    assert [o["count"] for o in outs] == [8, 8, 9] and all(len(json.dumps(o)) < 2000 for o in outs)
    assert [o["owners"] for o in outs] == [2, 3, 2]  # owners O1 and O2 in every range, o3 in one
    assert len({o["delta_version"] for o in outs}) == 3  # one commit per range
    rows = staging_rows(storage_root, interval_id=record["interval_id"])
    staged = {}
    for row in rows:
        assert row["stream_seq"] not in staged, f"sequence {row['stream_seq']} staged twice"
        staged[row["stream_seq"]] = row
        assert truth[row["stream_seq"]][0] == row["subject"] and row["subject"].split(".")[2] == row["owner_id"]
        assert row["event_type"] == row["subject"].rsplit(".", 1)[-1]
    assert sorted(staged) == sorted(truth) == sorted(seqs)
    files = ledger_files(Layout.of(storage_root), "EVENTS", record["interval_id"])
    ranges_of_o1 = {staging.file_range(f.path)[0] for f in files if f.min_owner <= O1 <= f.max_owner}
    assert ranges_of_o1 == {0, 1, 2}  # O1's batches: a run in a file of every range
    assert len(files) <= 3 * 2  # ranges x event types (one file each at this size)

    # a selection of owners: only their messages are counted, read and staged
    other = storage_root + "/selection"
    chosen = plan_ledger(other, start_ns, end_ns, owners=[O1, o3], max_ranges=2, range_messages=1)
    assert chosen["total"] == 13 and chosen["not_requested"] == 12 and chosen["read_filters"] == [
        f"plgd.owners.{O1}.>", f"plgd.owners.{o3}.>"]
    assert sum(o["count"] for o in fetch_ranges(other, chosen)) == 13
    assert {r["owner_id"] for r in staging_rows(other, interval_id=chosen["interval_id"])} == {O1, o3}
    with pytest.raises(ValueError, match="ledger range 2 does not exist"):
        run_op(ledger_range=2, ledger=Layout.of(other).ledger_interval_dir("EVENTS", chosen["interval_id"]), storage_root=other)


def test_a_range_of_many_owners_over_a_small_buffer_spills_sorted_runs_and_stages_everything(
        jetstream, storage_root, tmp_path):
    """``range_buffer_bytes`` far below the range's payload: the task spills sorted runs to its
    spill folder many times and merges them at the end, with few files open (a low open-files
    limit holds). Every message is staged once with its payload, rows ordered by owner then
    stream sequence, in at most ⌈payload / target_file_bytes⌉ files per event type; the spill
    files are gone afterwards."""
    import os
    import resource

    from airflow_provider_plgd.spark.decode_job import ledger_files

    owners = [f"{i:08x}-0000-4000-8000-000000000000" for i in range(300)]
    publish_messages(jetstream.url, [(registrations_subject(o, "devicesregistered"), bytes([r, i % 251]) * 1000, None)
                                     for r in range(2) for i, o in enumerate(owners)])
    start_ns, end_ns = bounds_around(jetstream.url)
    truth = read_stream(jetstream.url)
    record = plan_ledger(storage_root, start_ns, end_ns, event_types=("devicesregistered",))
    base = Layout.of(storage_root).ledger_interval_dir("EVENTS", record["interval_id"])
    spill = tmp_path / "spill"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 100, hard))
    try:
        out = run_op(ledger_range="0", ledger=base, storage_root=storage_root, range_buffer_bytes=64 * 1024,
                     batch_size=20, spool_dir=str(spill), target_file_bytes=250_000, row_group_size=100)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert (out["count"], out["owners"], out["batches"]) == (600, 300, 300)
    assert os.listdir(spill) == []  # the runs were spilled there and removed
    files = ledger_files(Layout.of(storage_root), "EVENTS", record["interval_id"])
    assert len(files) == out["files"] == -(-1_200_000 // 250_000)  # ceil(payload / target)
    rows = staging_rows(storage_root, interval_id=record["interval_id"])
    assert {r["stream_seq"]: (r["subject"], r["data"]) for r in rows} == \
        {seq: (subject, data) for seq, (subject, _t, _h, data) in truth.items()}
    for f in files:  # each file sorted by owner, then stream sequence
        import pyarrow.parquet as pq

        got = pq.read_table(f.url, columns=["owner_id", "stream_seq"]).to_pylist()
        keys = [(r["owner_id"], r["stream_seq"]) for r in got]
        assert keys == sorted(keys) and (f.min_owner, f.max_owner) == (keys[0][0], keys[-1][0])
    with pytest.raises(ValueError, match="range_buffer_bytes must be a positive integer, got 0"):
        run_op(ledger_range="0", ledger=base, storage_root=storage_root, range_buffer_bytes=0)


# ---------------------------------------------------------------------------------------------
# Odd owner tokens and our reserved names (docs/reliability.md, "Owner tokens that are not owner IDs")
# ---------------------------------------------------------------------------------------------
def test_non_utf8_and_reserved_owner_tokens_are_staged_as_unrouted_and_counted_exactly(jetstream, storage_root):
    """Before: ``plgd.owners.ab\\xff.…`` was discovered as owner ``ab\\ufffd``, counted 0 under the
    re-encoded filter, and skipped by the unrouted fetch as owned: gone, with the ledger adding up.
    ``plgd.owners._unrouted.…`` collided with the unrouted batch (LedgerError on every rerun, or a
    lost message). Now an owner token that is not an owner ID (``subjects.validate_owner_id``: U+FFFD,
    a leading ``_``) is never an owner: its messages are staged in the unrouted batch, which must hold
    exactly the plan's unrouted count, and decode quarantines them (``bad_subject``). Our reserved
    names as event-type tokens go to the owner's ``_unknown`` batch (``unknown_event_type``)."""
    from airflow_provider_plgd import decode_message
    from airflow_provider_plgd.hooks.jetstream import JetStreamHook
    from airflow_provider_plgd.plgd.codec import PlgdDecodeError
    from airflow_provider_plgd.spark.decode_job import ledger_files
    from tests.integration.fetch_faults import raw_publish

    start_ns = time.time_ns() // 10**9 * 10**9
    publish_messages(jetstream.url, traffic(2))  # 8 messages of O1 and O2
    raw_publish(jetstream, b"plgd.owners.ab\xff.registrations.devicesregistered", b"not utf-8")  # the case
    reserved_owner = [f"plgd.owners.{name}.registrations.devicesregistered"
                      for name in (ledger.UNROUTED_OWNER, ledger.UNKNOWN_EVENT_TYPE)]
    reserved_type = [f"plgd.owners.{O1}.registrations.{ledger.UNKNOWN_EVENT_TYPE}",
                     resource_subject(O1, DEV, HREF, "resourcechanged").replace("resourcechanged", ledger.UNROUTED_OWNER)]
    publish_messages(jetstream.url, [(s, b"r", None) for s in reserved_owner + reserved_type])
    hook = JetStreamHook()
    deadline = time.monotonic() + 10
    while hook.stream_info()["state"]["messages"] < 13 and time.monotonic() < deadline:
        time.sleep(0.05)
    end_ns = (time.time_ns() // 10**9 + 1) * 10**9  # (nats-py's own reader cannot read the raw subject)
    while time.time_ns() < end_ns + 50_000_000:
        time.sleep(0.05)
    owners = hook.list_owners()
    assert sorted(owners) == sorted([O1, O2])  # neither ab\ufffd nor a reserved name is an owner

    record = plan_ledger(storage_root, start_ns, end_ns, max_ranges=2, range_messages=5)
    assert record["total"] == 13 and record["fetch_ranges"] == 2
    outs = fetch_ranges(storage_root, record)
    assert sum(o["count"] for o in outs) == 13 and all(o["skipped"] == {} for o in outs)

    assert sum(f.rows for f in ledger_files(Layout.of(storage_root), "EVENTS", record["interval_id"])) == 13  # decode's reader
    staged: dict[tuple[str, str], list[str]] = {}
    for row in staging_rows(storage_root, interval_id=record["interval_id"]):  # a batch may have rows in each range
        staged.setdefault((row["owner_id"], row["event_type"]), []).append(row["subject"])
    assert sum(len(v) for v in staged.values()) == 13
    assert sorted(staged[(ledger.UNROUTED_OWNER, ledger.UNKNOWN_EVENT_TYPE)]) == sorted(
        ["plgd.owners.ab\ufffd.registrations.devicesregistered", *reserved_owner])
    assert sorted(staged[(O1, ledger.UNKNOWN_EVENT_TYPE)]) == sorted(reserved_type)
    # decode's verdict on each (the decode application's code path, one message at a time)
    for subject, reason in [(s, "bad_subject") for s in staged[(ledger.UNROUTED_OWNER, ledger.UNKNOWN_EVENT_TYPE)]] \
            + [(s, "unknown_event_type") for s in reserved_type]:
        with pytest.raises(PlgdDecodeError) as err:
            decode_message(subject, b"r")
        assert err.value.reason == reason, (subject, err.value.reason)
