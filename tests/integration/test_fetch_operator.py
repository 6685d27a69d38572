"""JetStreamToStagingOperator against a real nats-server, in real Airflow DAG runs (dag.test) and via execute().

Ground truth: every message of the stream with its exact server timestamp, read independently of
the hook with nats-py (``conftest.read_stream``). Expected rows per owner x event type x interval
are computed from it with NATS subject matching over the filters of ``plgd.subjects.subject_filters``.
A server restart mid-fetch, durable mode, spooling and the server's clock: test_fetch_operator_faults.py.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from airflow_provider_plgd import times
from airflow_provider_plgd.exceptions import (
    JetStreamAuthError,
    StreamNotFoundError,
)
from airflow_provider_plgd.operators.jetstream_to_staging import JetStreamToStagingOperator
from airflow_provider_plgd.plgd.subjects import (
    registrations_subject,
    resource_subject,
)
from airflow_provider_plgd.tables import staging
from airflow_provider_plgd.tables.layout import Layout
from plgd_devtools.nats_server import NatsServer, recreate_stream
from tests.integration.conftest import load_dag, publish_messages, read_stream, xcom_value
from tests.integration.delta_read import staging_batches, staging_rows
from tests.integration.fetch_operator_runs import (
    DEV,
    EVENT_TYPES,
    HREF,
    O1,
    O2,
    batch_rows,
    committed_seqs,
    expected_seqs,
    file_digests,
    make_messages,
    run_op,
)

pytestmark = pytest.mark.airflow

UTC = timezone.utc

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
