"""JetStreamToStagingOperator against a real nats-server, in real Airflow DAG runs (dag.test) and via execute().

Ground truth: every message of the stream with its exact server timestamp, read independently of
the hook with nats-py (``conftest.read_stream``). Expected rows per owner x event type x interval
are computed from it with NATS subject matching over the filters of ``plgd.subjects.subject_filters``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from airflow_provider_plgd import times
from airflow_provider_plgd.exceptions import (
    IntervalNotCompleteError,
    JetStreamAuthError,
    JetStreamError,
    StreamNotFoundError,
)
from airflow_provider_plgd.operators.jetstream_to_staging import JetStreamToStagingOperator
from airflow_provider_plgd.plgd.subjects import (
    metadata_subject,
    registrations_subject,
    resource_subject,
    subject_filters,
    subject_matches,
)
from airflow_provider_plgd.tables import staging, staging_commits
from airflow_provider_plgd.tables.layout import Layout
from plgd_devtools.nats_server import NatsServer, recreate_stream
from tests.integration.conftest import load_dag, publish_messages, read_stream, xcom_value
from tests.integration.delta_read import staging_batches, staging_rows

pytestmark = pytest.mark.airflow

UTC = timezone.utc
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


# ---------------------------------------------------------------------------------------------
# A real DAG run per interval
# ---------------------------------------------------------------------------------------------
DAG_FILE = """
import tempfile
from datetime import datetime, timedelta, timezone
from airflow.sdk import DAG
from airflow_provider_plgd.operators.jetstream_to_staging import JetStreamToStagingOperator

with DAG("plgd_test_fetch_intervals", schedule=timedelta(seconds=INTERVAL),
         start_date=datetime(2026, 1, 1, tzinfo=timezone.utc), catchup=False, render_template_as_native_obj=True,
         params={"storage_root": "", "owners": [], "event_types": []}) as dag:
    JetStreamToStagingOperator(task_id="fetch_group", owner_ids="{{ params.owners }}",
                               event_types="{{ params.event_types }}", row_group_size=7,
                               storage_roots=[tempfile.gettempdir()])  # where a run's storage_root may point
    JetStreamToStagingOperator(task_id="fetch_one", owner_id="OWNER", event_type="resourcechanged",
                               storage_root="{{ params.storage_root }}/single")
"""


def test_dag_runs_write_exact_rows_per_owner_event_type_and_interval(jetstream, dags_folder, storage_root):
    interval = 1.5
    path = dags_folder / "plgd_test_fetch_intervals.py"
    path.write_text(DAG_FILE.replace("INTERVAL", str(interval)).replace("OWNER", O1))
    dag = load_dag(path, "plgd_test_fetch_intervals")
    # Publish 3 intervals of traffic, each inside its own wall-clock interval [S + k*D, S + (k+1)*D).
    start = (int(time.time() / interval) + 1) * interval
    for k in range(3):
        time.sleep(max(0.0, start + k * interval + 0.05 - time.time()))
        publish_messages(jetstream.url, make_messages(f"i{k}", 10 + 5 * k))
        assert time.time() < start + (k + 1) * interval, "publishing took longer than an interval"
    time.sleep(max(0.0, start + 3 * interval - time.time()))
    truth = read_stream(jetstream.url)
    assert len(truth) == sum(8 * (10 + 5 * k) for k in range(3))

    for k in range(3):
        end = datetime.fromtimestamp(start + (k + 1) * interval, tz=UTC)
        dr = dag.test(logical_date=end, run_conf={"storage_root": storage_root, "owners": [O1, O2],
                                                  "event_types": EVENT_TYPES})
        assert str(dr.state) in ("success", "DagRunState.SUCCESS"), dr.state
        assert dr.data_interval_end == end and dr.data_interval_start == end - timedelta(seconds=interval)
        summary = xcom_value(dr, "fetch_group")
        assert summary["interval_id"] == times.interval_id(end - timedelta(seconds=interval), end)
        assert [(b["owner_id"], b["event_type"]) for b in summary["batches"]] == \
            [(o, e) for o in (O1, O2) for e in [*EVENT_TYPES, "_unknown"]]
        assert summary["count"] == sum(b["count"] for b in summary["batches"]) > 0
        assert summary["root"] == storage_root and summary["mode"] == "time"

    total = 0
    for k in range(3):
        s_ns, e_ns = int((start + k * interval) * 1e9), int((start + (k + 1) * interval) * 1e9)
        iid = times.interval_id(s_ns, e_ns)
        batches = staging_batches(storage_root, interval_id=iid)
        assert sorted(batches) == sorted((o, e, iid) for o in (O1, O2) for e in EVENT_TYPES)  # no _unknown row
        for (owner, event_type, _), rows in batches.items():
            want = expected_seqs(truth, owner, event_type, s_ns, e_ns)
            assert want, "every owner x event type has traffic in every interval"
            assert [r["stream_seq"] for r in rows] == want
            assert [r["data"] for r in rows] == [truth[s][3] for s in want]
            assert all(s_ns <= int(r["published_at"].timestamp() * 1e6) * 1000 < e_ns for r in rows)
            total += len(rows)
        # resource event types: the messages of both filters (S4, then the .leadrt forms), in stream order
        rc = batches[(O1, "resourcechanged", iid)]
        assert {r["subject"].count(".leadrt") for r in rc} == {0, 1}
        assert committed_seqs(storage_root + "/single", O1, "resourcechanged", iid) == [r["stream_seq"] for r in rc]
    assert total == len(truth)  # every message in exactly one interval


def test_missing_data_interval_fails_the_run_with_a_clear_message(jetstream, dags_folder, storage_root, capfd):
    path = dags_folder / "plgd_test_fetch_no_interval.py"
    path.write_text(
        "from airflow.sdk import DAG\n"
        "from airflow_provider_plgd.operators.jetstream_to_staging import JetStreamToStagingOperator\n"
        "with DAG('plgd_test_fetch_no_interval', schedule=None, catchup=False) as dag:\n"
        f"    JetStreamToStagingOperator(task_id='fetch', owner_id='{O1}', event_type='devicesregistered',\n"
        f"                               storage_root={storage_root!r})\n"
    )
    dag = load_dag(path, "plgd_test_fetch_no_interval")
    dr = dag.test(logical_date=None)  # a manual run on Airflow 3: no logical date, no data interval
    assert "failed" in str(dr.state).lower()
    assert "has no data interval" in capfd.readouterr().out
    with pytest.raises(ValueError, match="has no data interval"):
        run_op(owner_id=O1, event_type="devicesregistered", storage_root=storage_root)
    assert os.listdir(storage_root) == []
    # explicit bounds make it work without a data interval
    out = run_op(owner_id=O1, event_type="devicesregistered", storage_root=storage_root,
                 start_time="2026-01-01T00:00:00Z", end_time="2026-01-01T01:00:00Z")
    assert out["count"] == 0 and out["interval_id"] == "20260101T000000Z_20260101T010000Z"


# ---------------------------------------------------------------------------------------------
# edges, reruns, empty intervals
# ---------------------------------------------------------------------------------------------
def test_messages_on_interval_edges_go_to_exactly_one_interval(jetstream, storage_root):
    publish_messages(jetstream.url, make_messages("edge", 15))
    truth = read_stream(jetstream.url)
    ordered = sorted(truth)
    # boundaries exactly at server timestamps of messages (ns), so those messages sit on an edge
    cuts = [truth[ordered[0]][1], truth[ordered[37]][1], truth[ordered[38]][1], truth[ordered[90]][1],
            truth[ordered[-1]][1] + 1]
    seen: dict[int, str] = {}
    for s_ns, e_ns in itertools.pairwise(cuts):
        out = run_op(owner_ids=[O1, O2], event_types=EVENT_TYPES, storage_root=storage_root,
                     start_time=s_ns, end_time=e_ns, batch_size=17)
        assert out["interval_id"] == times.interval_id(s_ns, e_ns)
        for batch in out["batches"]:
            got = committed_seqs(storage_root, batch["owner_id"], batch["event_type"], out["interval_id"])
            assert got == expected_seqs(truth, batch["owner_id"], batch["event_type"], s_ns, e_ns)
            assert batch["count"] == len(got)
            for seq in got:
                assert seq not in seen, f"seq {seq} in two intervals"
                seen[seq] = out["interval_id"]
    assert sorted(seen) == ordered
    # the message exactly at a boundary belongs to the interval that starts there
    assert seen[ordered[37]] == times.interval_id(cuts[1], cuts[2])
    assert seen[ordered[38]] == times.interval_id(cuts[2], cuts[3])
    assert seen[ordered[36]] == times.interval_id(cuts[0], cuts[1])


def test_rerun_gives_the_same_files_and_replaces_the_batch(jetstream, storage_root):
    """A rerun of a batch with other pull batching writes byte-identical data files (under new
    names) and replaces the batch's rows in one commit: the table holds them once."""
    publish_messages(jetstream.url, make_messages("rerun", 40))
    kw = dict(owner_id=O1, event_type="resourcechanged", storage_root=storage_root,
              start_time="2020-01-01T00:00:00Z", end_time=time.time_ns(), row_group_size=10,
              max_rows_per_file=25)
    first = run_op(batch_size=1000, **kw)
    before = file_digests(storage_root)
    assert len(before) > 2 and first["batches"][0]["files"] == len(before)
    second = run_op(batch_size=3, **kw)  # different fetch batching
    strip = lambda out: {**out, "batches": [{**b, "delta_version": None} for b in out["batches"]]}  # noqa: E731
    assert strip(second) == strip(first) and second["batches"][0]["delta_version"] > first["batches"][0]["delta_version"]
    assert file_digests(storage_root) == before
    assert len(staging_rows(storage_root)) == first["count"] == 80


def test_owner_wide_consumer_gives_the_rows_of_one_consumer_per_filter(jetstream, tmp_path):
    """owner_ids x event_types reads each owner through one consumer and routes on the client; the
    batches hold the same rows as single (owner, event type) fetches with a consumer per filter
    (byte-identical data files), also for subjects that do not parse (kept where their filter
    matches) and types not asked. Subjects that match no requested filter go to the owner's
    ``_unknown`` batch; known types that were not requested are counted as skipped (nothing is
    dropped without a count)."""
    extra = [
        (resource_subject(O1, DEV, HREF, "resourcechanged") + ".leadrt", b"no lead type after leadrt", None),
        (resource_subject(O1, DEV, HREF, "resourcedeleted"), b"not requested", None),
        (f"plgd.owners.{O2}.registrations.devicesregistered.extra", b"matches no filter", None),
    ]
    publish_messages(jetstream.url, make_messages("wide", 12)[:40] + extra + make_messages("wide2", 6))
    kw = dict(start_time="2020-01-01T00:00:00Z", end_time=time.time_ns(), row_group_size=5,
              max_rows_per_file=11)
    grouped_root = str(tmp_path / "grouped")
    grouped = run_op(owner_ids=[O1, O2], event_types=EVENT_TYPES, storage_root=grouped_root, batch_size=7, **kw)
    assert [(b["owner_id"], b["event_type"]) for b in grouped["batches"]] == \
        [(o, e) for o in (O1, O2) for e in [*EVENT_TYPES, "_unknown"]]
    unknown = {b["owner_id"]: b for b in grouped["batches"] if b["event_type"] == "_unknown"}
    assert unknown[O1]["count"] == 0 and unknown[O2]["count"] == 1
    assert [r["subject"] for r in batch_rows(grouped_root, O2, "_unknown")] == \
        [f"plgd.owners.{O2}.registrations.devicesregistered.extra"]
    for batch in (b for b in grouped["batches"] if b["event_type"] != "_unknown"):
        single_root = str(tmp_path / "single" / batch["owner_id"] / batch["event_type"])
        single = run_op(owner_id=batch["owner_id"], event_type=batch["event_type"], storage_root=single_root, **kw)
        assert batch_rows(grouped_root, batch["owner_id"], batch["event_type"]) == \
            batch_rows(single_root, batch["owner_id"], batch["event_type"]), batch["event_type"]
        mine = [f for f in staging.staged_files(Layout.of(grouped_root), "EVENTS", event_types=[batch["event_type"]])
                if staging.file_batch_owner(f.path) == batch["owner_id"]]
        assert sorted(hashlib.sha256(Path(f.url).read_bytes()).hexdigest() for f in mine) == file_digests(single_root)
        assert single["count"] == batch["count"] == len(batch_rows(single_root, batch["owner_id"], batch["event_type"]))
    counts = {(b["owner_id"], b["event_type"]): b["count"] for b in grouped["batches"]}
    assert counts[(O1, "resourcechanged")] == 5 * 2 + 6 * 2 + 1  # 40 msgs = 5 rounds; + the unparsable one
    assert grouped["count"] == sum(counts.values()) == len(staging_rows(grouped_root))
    assert grouped["skipped"] == {"event_type_not_requested": 1}  # the resourcedeleted message


def test_empty_interval_commits_no_row_and_replaces_the_batch(jetstream, storage_root):
    publish_messages(jetstream.url, make_messages("x", 2))
    kw = dict(owner_id=O2, event_type="resourcechanged", storage_root=storage_root, start_time="2020-01-01T00:00:00Z")
    out = run_op(end_time="2020-01-01T01:00:00Z", **kw)
    assert out["count"] == 0 and out["first_seq"] is None and out["batches"][0]["files"] == 0
    assert out["batches"][0]["delta_version"] is not None and staging_rows(storage_root) == []
    # batches of other owners of the same interval and event type live side by side
    end = time.time_ns()
    assert run_op(end_time=end, **kw)["count"] == 4
    assert run_op(end_time=end, **{**kw, "owner_id": O1})["count"] == 4
    assert run_op(end_time=end, **kw)["count"] == 4  # a rerun replaces only O2's rows
    assert sorted((r["owner_id"], r["stream_seq"]) for r in staging_rows(storage_root)) == sorted(
        (o, s) for o in (O1, O2) for s in expected_seqs(read_stream(jetstream.url), o, "resourcechanged", 0, end))


def test_seq_range_and_subject_filter_modes(jetstream, storage_root):
    publish_messages(jetstream.url, make_messages("seq", 10))
    truth = read_stream(jetstream.url)
    out = run_op(owner_id=O1, event_type="devicesregistered", storage_root=storage_root, start_seq="5", end_seq="60")
    assert out["interval_id"] == "seq-000000000005-000000000060" and out["mode"] == "seq"
    want = [s for s in sorted(truth) if 5 <= s <= 60 and truth[s][0] == registrations_subject(O1, "devicesregistered")]
    assert committed_seqs(storage_root, O1, "devicesregistered", out["interval_id"]) == want
    # open end: the stream's last sequence at task start
    out = run_op(owner_id=O1, event_type="devicesregistered", storage_root=storage_root, start_seq=70)
    assert out["interval_id"] == f"seq-000000000070-{max(truth):012d}"
    # an arbitrary filter
    out = run_op(subject_filter="plgd.owners.*.devices.*.metadata.>", storage_root=storage_root,
                 start_seq=1, end_seq=max(truth))
    key = staging.filter_key(["plgd.owners.*.devices.*.metadata.>"])
    assert [(b["owner_id"], b["event_type"]) for b in out["batches"]] == [("_filter", key)]
    assert committed_seqs(storage_root, "_filter", key, out["interval_id"]) == \
        [s for s in sorted(truth) if ".metadata." in truth[s][0]]
    # content is the payload exactly as stored, with headers and msg_id
    out = run_op(owner_id=O2, event_type="devicesregistered", storage_root=storage_root, start_seq=1)
    rows = batch_rows(storage_root, O2, "devicesregistered", out["interval_id"])
    assert len(rows) == out["count"] == 10
    for row in rows:
        subj, ts, hdr, data = truth[row["stream_seq"]]
        assert (row["subject"], row["data"], row["stream"]) == (subj, data, "EVENTS")
        assert int(row["published_at"].timestamp() * 1_000_000) == ts // 1000
        assert row["msg_id"] == (hdr or {}).get("Nats-Msg-Id")
        assert (dict(row["headers"]) if row["headers"] else None) == hdr


def test_destinations_object_storage_path_and_defaults(jetstream, tmp_path, monkeypatch):
    from airflow.sdk import ObjectStoragePath

    publish_messages(jetstream.url, make_messages("dst", 3))
    kw = dict(owner_id=O1, event_type="devicesregistered", start_seq=1)
    out = run_op(storage_root=ObjectStoragePath(f"file://{tmp_path}/osp"), **kw)
    assert out["path"] == str(tmp_path / "osp" / "staging" / "EVENTS") and out["count"] == 3
    assert len(staging_rows(tmp_path / "osp")) == 3
    # DAG param storage_root (a root the operator's storage_roots allow), then the connection's
    # storage_root extra, then $AIRFLOW_HOME/plgd
    op = JetStreamToStagingOperator(task_id="f", storage_roots=[str(tmp_path / "param")], **kw)
    assert op.execute({"params": {"storage_root": str(tmp_path / "param")}})["root"] == str(tmp_path / "param")
    from airflow_provider_plgd.run_params import UntrustedRunParamError

    with pytest.raises(UntrustedRunParamError, match="is not a root this DAG allows"):
        op.execute({"params": {"storage_root": str(tmp_path / "elsewhere")}})
    assert not (tmp_path / "elsewhere").exists()
    conn = json.loads(os.environ["AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT"])
    conn["extra"]["storage_root"] = str(tmp_path / "conn")
    monkeypatch.setenv("AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT", json.dumps(conn))
    assert op.execute({"params": {}})["root"] == str(tmp_path / "conn")
    conn["extra"].pop("storage_root")
    monkeypatch.setenv("AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT", json.dumps(conn))
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    assert op.execute({"params": {}})["root"] == str(tmp_path / "home" / "plgd")


# ---------------------------------------------------------------------------------------------
# bad input and server-side errors: documented results, nothing committed
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("field,value,match", [
    ("owner_id", "own*er", r"owner_id 'own\*er' is not a valid NATS subject token"),
    ("owner_id", "own>er", "owner_id 'own>er' is not a valid"),
    ("owner_id", "../etc", "owner_id '../etc' is not a valid"),
    ("owner_id", "a/b", "owner_id 'a/b' is not a valid"),
    ("owner_id", "an owner", "owner_id 'an owner' is not a valid"),
    ("event_type", "resource changed", "event_type 'resource changed' is not a valid"),
    ("event_type", "nosuchevent", "nosuchevent"),
])
def test_invalid_tokens_are_rejected_before_any_subject_or_path(field, value, match, tmp_path, monkeypatch):
    # the connection points nowhere: validation must fail before any connection or storage access
    monkeypatch.setenv("AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT", '{"conn_type": "plgd_jetstream", "host": "192.0.2.1"}')
    kw = {"owner_id": O1, "event_type": "devicesregistered", field: value}
    with pytest.raises(ValueError, match=match):
        run_op(storage_root=str(tmp_path / "root"), start_seq=1, **kw)
    with pytest.raises(ValueError, match=match.split(" ")[0]):
        run_op(storage_root=str(tmp_path / "root"), start_seq=1, owner_ids=[kw["owner_id"]], event_types=[kw["event_type"]])
    assert not (tmp_path / "root").exists()


def test_conflicting_arguments_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="exactly one target"):
        run_op(owner_id=O1, event_type="devicesregistered", subject_filter="plgd.>", storage_root=str(tmp_path))
    with pytest.raises(ValueError, match="choose one kind of bounds"):
        run_op(owner_id=O1, event_type="devicesregistered", start_seq=1, start_time="2026-01-01T00:00:00Z",
               storage_root=str(tmp_path))
    with pytest.raises(ValueError, match="not a valid NATS filter"):
        run_op(subject_filter="plgd. >", start_seq=1, storage_root=str(tmp_path))


def test_missing_stream_fails_cleanly(jetstream, storage_root):
    with pytest.raises(StreamNotFoundError, match="NOSUCH"):
        run_op(owner_id=O1, event_type="devicesregistered", stream="NOSUCH", storage_root=storage_root, start_seq=1)
    assert os.listdir(storage_root) == []


def test_wrong_credentials_fail_cleanly_without_leaking_the_password(tmp_path, monkeypatch, storage_root):
    conf = tmp_path / "auth.conf"
    conf.write_text('authorization { user: "plgd", password: "right-secret" }\n')
    with NatsServer(extra_args=("-c", str(conf))) as server:
        recreate_stream(f"nats://plgd:right-secret@{server.host}:{server.port}")
        monkeypatch.setenv("AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT", json.dumps(
            {"conn_type": "plgd_jetstream", "host": server.host, "port": server.port, "login": "plgd",
             "password": "wrong-secret-123"}))
        with pytest.raises(JetStreamAuthError) as err:
            run_op(owner_id=O1, event_type="devicesregistered", storage_root=storage_root, start_seq=1)
        assert "wrong-secret-123" not in str(err.value) and "right-secret" not in str(err.value)
        assert os.listdir(storage_root) == []
        conn = json.loads(os.environ["AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT"])
        conn["password"] = "right-secret"
        monkeypatch.setenv("AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT", json.dumps(conn))
        assert run_op(owner_id=O1, event_type="devicesregistered", storage_root=storage_root, start_seq=1)["count"] == 0


# ---------------------------------------------------------------------------------------------
# server restart in the middle of a fetch
# ---------------------------------------------------------------------------------------------
def test_server_restart_mid_fetch_then_retry_commits_no_gap_no_duplicate(jetstream, storage_root, monkeypatch):
    from airflow_provider_plgd.fetch.stager import Stager

    n = 6000
    subj = registrations_subject(O1, "devicesregistered")
    publish_messages(jetstream.url, [(subj, f"m{i}".encode() * 20, None) for i in range(n)], window=1000)
    truth = read_stream(jetstream.url)
    kw = dict(owner_id=O1, event_type="devicesregistered", storage_root=storage_root, start_seq=1,
              end_seq=max(truth), batch_size=50, row_group_size=500)
    # an earlier committed run of the same interval (e.g. before a clear + rerun)
    run_op(**kw)
    before = staging_rows(storage_root)
    assert [r["stream_seq"] for r in before] == sorted(truth)

    # slow the fetch down so the restart lands in the middle of it
    progress = {"rows": 0}
    real_add = Stager.add

    def slow_add(self, owner, event_type, messages):
        real_add(self, owner, event_type, messages)
        progress["rows"] += len(messages)
        time.sleep(0.01)

    monkeypatch.setattr(Stager, "add", slow_add)
    result: dict = {}

    def fetch():
        try:
            result["out"] = run_op(**kw)
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=fetch)
    thread.start()
    deadline = time.monotonic() + 30
    while progress["rows"] < 1000 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert 0 < progress["rows"] < n, progress
    jetstream.stop()
    # while the server is down: readers see the earlier commit whole, nothing of the rerun
    time.sleep(0.5)
    assert staging_rows(storage_root) == before
    jetstream.start()
    thread.join(60)
    assert not thread.is_alive()
    if "error" in result:  # failed cleanly: a typed error, the earlier commit still whole
        assert isinstance(result["error"], JetStreamError), repr(result["error"])
        assert staging_rows(storage_root) == before
    monkeypatch.setattr(Stager, "add", real_add)
    out = run_op(**kw)  # the retry
    assert [r["stream_seq"] for r in staging_rows(storage_root)] == sorted(truth)  # no gap, no duplicate
    assert out["count"] == n and len(staging.staged_files(Layout.of(storage_root), "EVENTS")) == out["batches"][0]["files"]


# ---------------------------------------------------------------------------------------------
# durable-consumer mode
# ---------------------------------------------------------------------------------------------
def test_durable_mode_batches_ack_after_commit_and_redeliver_on_failure(jetstream, storage_root, monkeypatch):
    publish_messages(jetstream.url, make_messages("dur", 10))
    truth = read_stream(jetstream.url)
    all_rc = expected_seqs(truth, O1, "resourcechanged", 0, 2**63)
    kw = dict(owner_id=O1, event_type="resourcechanged", storage_root=storage_root, durable="plgd_test_dur",
              max_messages=12, ack_wait_seconds=1.0)
    first = run_op(**kw)
    assert first["count"] == 12 and first["interval_id"].startswith("durable-")
    # a failed commit does not ack: the next run (after ack_wait) gets the same messages again
    real_commit = staging_commits.commit_batches
    monkeypatch.setattr(staging_commits, "commit_batches", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        run_op(**kw)
    monkeypatch.setattr(staging_commits, "commit_batches", real_commit)
    time.sleep(1.5)
    intervals = [first["interval_id"]]
    while True:
        out = run_op(**kw)
        if out["count"] == 0:
            break
        intervals.append(out["interval_id"])
    # at-least-once and, here, exactly once: every message of the selection once, in stream order per batch
    batches = staging_batches(storage_root)
    assert sorted(i for _o, _e, i in batches) == sorted(intervals) and len(intervals) == -(-len(all_rc) // 12)
    got = [r["stream_seq"] for rows in batches.values() for r in rows]
    assert sorted(got) == sorted(all_rc) and all(r["owner_id"] == O1 for rows in batches.values() for r in rows)


def test_progress_is_logged_during_long_fetches(jetstream, storage_root, caplog, capfd):
    publish_messages(jetstream.url, [(registrations_subject(O1, "devicesregistered"), b"p" * 100, None)] * 1000)
    run_op(owner_id=O1, event_type="devicesregistered", storage_root=storage_root, start_seq=1, batch_size=100,
           progress_every_messages=250, progress_interval_seconds=3600)
    text = caplog.text + capfd.readouterr().out
    lines = [x for x in text.splitlines() if "behind the stream head" in x]
    assert len(lines) >= 3, text[-3000:]
    assert "msgs/s" in lines[0] and "MB/s" in lines[0] and "at seq" in lines[0]


# ---------------------------------------------------------------------------------------------
# spooling: none for bounded fetches, a documented folder for durable mode
# ---------------------------------------------------------------------------------------------
def test_nothing_spills_to_tmpdir_and_spills_go_where_configured(jetstream, tmp_path, monkeypatch):
    """Before: the owner-wide fetch spooled every second filter to $TMPDIR, and durable mode too
    (``plgd-durable-*.arrow``, left behind by a kill; a bare ENOSPC). Now a fetch keeps its rows
    in memory up to ``range_buffer_bytes`` and writes nothing to $TMPDIR; past it, sorted runs go
    to the spill folder under the storage root (or ``spool_dir``), the leftovers of killed runs are
    removed, and a full disk names the spill file."""
    import tempfile

    publish_messages(jetstream.url, make_messages("spool", 12))
    truth = read_stream(jetstream.url)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-tmpdir"))  # any use of $TMPDIR fails
    root = str(tmp_path / "root")
    grouped = run_op(owner_ids=[O1, O2], event_types=EVENT_TYPES, storage_root=root, batch_size=7,
                     start_time="2020-01-01T00:00:00Z", end_time=time.time_ns())
    for batch in grouped["batches"]:
        assert committed_seqs(root, batch["owner_id"], batch["event_type"]) == \
            expected_seqs(truth, batch["owner_id"], batch["event_type"], 0, 2**63)
    assert not Path(root, "staging", "_spool").exists()

    spool = Path(root, "staging", "_spool")  # the default spill folder of a local storage root
    spool.mkdir(parents=True)
    stale = [spool / "plgd-durable-spool-c-f1-99-deadbeef.arrow", spool / "plgd-stage-99-deadbeef-0.arrow"]
    young = spool / "plgd-stage-98-feedf00d-0.arrow"  # may belong to a live run: kept
    for path in [*stale, young]:
        path.write_bytes(b"x" * 1000)
    old = time.time() - 2 * 3600
    for path in stale:
        os.utime(path, (old, old))
    out = run_op(owner_id=O1, event_type="resourcechanged", durable="plgd_spool", storage_root=root,
                 range_buffer_bytes=200, batch_size=5)  # spills every few messages
    assert committed_seqs(root, O1, "resourcechanged", out["interval_id"]) == \
        expected_seqs(truth, O1, "resourcechanged", 0, 2**63)
    assert os.listdir(spool) == [young.name]  # its runs were removed, and the stale files

    # spool_dir: where the user says; a full disk (the folder holds a link to /dev/full) names the file
    full = tmp_path / "spill-on-a-full-disk"
    full.mkdir()
    real_osfile = __import__("pyarrow").OSFile

    def to_full(path, mode="r"):
        return real_osfile("/dev/full" if str(path).startswith(str(full)) else path, mode)

    monkeypatch.setattr("pyarrow.OSFile", to_full)
    with pytest.raises(OSError, match=rf"cannot write the spill file {full}/plgd-stage-.*No space left") as info:
        run_op(owner_id=O1, event_type="resourcechanged", durable="plgd_spool2", storage_root=root,
               spool_dir=str(full), range_buffer_bytes=200, batch_size=5)
    assert info.value.errno == 28


# ---------------------------------------------------------------------------------------------
# a time-bounded fetch commits only intervals complete on the server's clock
# ---------------------------------------------------------------------------------------------
def test_fetch_of_an_interval_not_complete_on_the_server_clock_fails_and_commits_nothing(jetstream, storage_root):
    """The fetch checks completeness itself (not only the sensor): while the NATS server's clock is
    before the end (+ settle_seconds) and the stream holds no message at or after the end, it fails
    with the retryable IntervalNotCompleteError naming the interval and the server's time, and
    commits nothing; the retry after the end commits every message of the interval."""
    subj = registrations_subject(O1, "devicesregistered")
    end_ns = time.time_ns() + 3_000_000_000
    start_ns = end_ns - 60_000_000_000
    publish_messages(jetstream.url, [(subj, f"early-{i}".encode(), None) for i in range(10)])
    kw = dict(owner_id=O1, event_type="devicesregistered", storage_root=storage_root, start_time=start_ns,
              end_time=end_ns)
    with pytest.raises(IntervalNotCompleteError) as info:
        run_op(**kw)
    err = info.value
    assert isinstance(err, JetStreamError)
    assert (err.stream, err.start_ns, err.end_ns, err.settle_seconds) == ("EVENTS", start_ns, end_ns, 0.0)
    assert start_ns < err.last_ts_ns < err.server_time_ns < end_ns
    text = str(err)
    assert f"[{times.ns_to_rfc3339(start_ns)}, {times.ns_to_rfc3339(end_ns)})" in text
    assert f"the server's time is {times.ns_to_rfc3339(err.server_time_ns)}" in text
    assert "nothing was committed" in text and "Retry after the interval's end" in text
    assert os.listdir(storage_root) == []

    publish_messages(jetstream.url, [(subj, f"late-{i}".encode(), None) for i in range(5)])
    assert time.time_ns() < end_ns, "the test machine was too slow"
    while time.time_ns() < end_ns + 50_000_000:
        time.sleep(0.02)
    # the server's clock passed the end, but not end + settle_seconds, and no newer message: still refused
    with pytest.raises(IntervalNotCompleteError, match="settle_seconds=30"):
        run_op(settle_seconds="30", **kw)  # templated fields arrive as strings
    assert os.listdir(storage_root) == []
    # settle_seconds 0 (default): the server's clock passed the end, nothing older can be stored any more
    out = run_op(**kw)
    data = [r["data"] for r in batch_rows(storage_root, O1, "devicesregistered", out["interval_id"])]
    assert data == [f"early-{i}".encode() for i in range(10)] + [f"late-{i}".encode() for i in range(5)]
    # a stored message at or after the end completes it under any settle time
    publish_messages(jetstream.url, [(subj, b"next interval", None)])
    again = run_op(settle_seconds=3600, **kw)
    strip = lambda x: {**x, "batches": [{**b, "delta_version": None} for b in x["batches"]]}  # noqa: E731
    assert again["stream_last_seq"] == 16 and strip({**again, "stream_last_seq": 15}) == strip(out)
    with pytest.raises(ValueError, match="settle_seconds must be a number of seconds >= 0, got '-1'"):
        run_op(settle_seconds="-1", **kw)
