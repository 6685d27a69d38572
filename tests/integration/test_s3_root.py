"""An S3 API as the storage root, through real parts: moto's standalone S3 server
(``s3`` fixture, :mod:`plgd_devtools.s3_server`) over HTTP, real nats-server, real Airflow.

* the harness itself and the root's one spelling (``s3a://`` is an alias of ``s3://``);
* the provider side on ``s3://<bucket>/plgd``: the fetch's staging, the interval ledger and the
  run summary, by running the ledger and fetch tests of ``test_ledger.py`` and
  ``test_fetch_operator.py`` again with the root on the bucket (same assertions), a byte-identical
  staging rerun, and listings that see what other processes wrote (no s3fs listings cache);
* the whole ETL DAG through ``dag.test()`` with the root on the bucket, its Spark tasks as clients
  of the session's Spark Connect server (``spark_connect_server``, whose Python workers have the
  S3 API's ``AWS_*`` environment; the ``spark-submit``-on-S3 path is proved by
  ``test_spark_cluster.py`` and ``test_spark_apps_s3.py``): snapshot = simulator, a rerun gives
  the same output, no credential in task logs or XCom.
"""

from __future__ import annotations

import json
import posixpath
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_plgd import times
from airflow_provider_plgd.tables import ledger, staging, storage
from airflow_provider_plgd.tables.layout import Layout
from airflow_provider_plgd.tables.storage_root import normalize_storage_root, resolve_storage_root
from tests.integration.conftest import publish_messages
from tests.integration.delta_read import staging_rows

# The same tests, with the storage root on the bucket (the ``storage_root`` fixture below).
from tests.integration.test_fetch_operator import (
    test_messages_on_interval_edges_go_to_exactly_one_interval,
)
from tests.integration.test_ledger import (
    test_decode_refuses_an_interval_whose_fetch_records_do_not_add_up,
    test_deletes_in_the_middle_are_recorded_and_a_rerun_with_fewer_is_refused,
    test_every_message_is_staged_once_across_ranges_owners_and_a_selection,
    test_fetch_counts_skips_and_fails_when_the_stream_changes_under_it,
    test_rerun_after_the_stream_was_recreated_refuses_to_commit_fewer,
)

#: The tests collected here again (pytest collects imported test functions; this names them for linters).
AGAIN_ON_S3 = (
    test_messages_on_interval_edges_go_to_exactly_one_interval,
    test_decode_refuses_an_interval_whose_fetch_records_do_not_add_up,
    test_deletes_in_the_middle_are_recorded_and_a_rerun_with_fewer_is_refused,
    test_fetch_counts_skips_and_fails_when_the_stream_changes_under_it,
    test_every_message_is_staged_once_across_ranges_owners_and_a_selection,
    test_rerun_after_the_stream_was_recreated_refuses_to_commit_fewer,
)


@pytest.fixture
def storage_root(s3) -> str:
    """The storage root of this module: ``s3://<bucket>/plgd`` on a fresh moto bucket."""
    return s3.root_url("plgd")


# ---------------------------------------------------------------------------------------------
# the harness and the root's spelling
# ---------------------------------------------------------------------------------------------
def test_the_harness_serves_s3_over_http_with_the_standard_environment(s3):
    import os

    import fsspec

    assert s3.endpoint_url.startswith("http://127.0.0.1:")
    assert {k: os.environ[k] for k in s3.env()} == s3.env()
    fs, path = fsspec.core.url_to_fs(s3.root_url("x") + "/a.json")
    fs.pipe_file(path, b"{}")
    assert fs.cat_file(path) == b"{}"
    s3.reset()
    fs.invalidate_cache()
    assert fs.ls(s3.bucket, detail=False) == []


@pytest.mark.parametrize("value, expected", [
    ("s3://bucket/plgd/", "s3://bucket/plgd"),
    ("s3a://bucket/plgd", "s3://bucket/plgd"),
    ("S3A://bucket/plgd/", "s3://bucket/plgd"),
    ("/data/plgd/", "/data/plgd"),
    ("gs://bucket/plgd", "gs://bucket/plgd"),
])
def test_one_spelling_for_s3_roots(value, expected, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="airflow_provider_plgd.tables.storage_root"):
        assert normalize_storage_root(value) == expected
        assert resolve_storage_root(value, None) == expected
    assert ("s3a:// is Hadoop's spelling" in caplog.text) == value.lower().startswith("s3a://")


@pytest.mark.parametrize("value", ["s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/plgd", "s3a://token@bucket/x"])
def test_credentials_in_the_root_are_refused_without_repeating_them(value):
    with pytest.raises(ValueError, match="credentials in the URL") as info:
        normalize_storage_root(value)
    assert "AKIA" not in str(info.value) and "token" not in str(info.value) and "wJal" not in str(info.value)


def test_the_connection_extra_gives_an_s3_root(s3, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT", json.dumps(
        {"conn_type": "plgd_jetstream", "host": "127.0.0.1", "port": 4222,
         "extra": {"stream": "EVENTS", "storage_root": "s3a://plgd-test/from-conn/"}}))
    from airflow_provider_plgd.hooks.base import connection_storage_root, resolve_layout

    assert connection_storage_root("plgd_jetstream_default") == "s3a://plgd-test/from-conn/"
    assert resolve_layout("", "plgd_jetstream_default").root == "s3://plgd-test/from-conn"


# ---------------------------------------------------------------------------------------------
# the provider side on the bucket: staging, ledger, run summary
# ---------------------------------------------------------------------------------------------
def _digest(folder: str) -> dict[str, str]:
    """``{name: sha256}`` of every object under a staging folder (hidden ones included)."""
    import hashlib

    fs, path = storage.to_fs(folder)
    fs.invalidate_cache()
    return {posixpath.basename(p): hashlib.sha256(fs.cat_file(p)).hexdigest()
            for p in sorted(fs.find(path))}


def test_fetch_ledger_and_summary_on_the_bucket_rerun_identical_and_no_credential_in_logs(
        jetstream, storage_root, s3, capfd, caplog):
    """The fetch stages to ``s3://…`` through the ledger; a rerun (other fetch batching) gives the
    same objects byte for byte, with no temporary objects left; the run summary reads the apps'
    summaries from the bucket and writes ``summary.json`` there; the logs name the root, never
    the credentials."""
    from airflow_provider_plgd.tables.run_summary import collect_run_summary
    from tests.integration.test_ledger import O1, O2, bounds_around, plan_ledger, run_op, traffic

    publish_messages(jetstream.url, traffic(30))  # 60 per owner
    start_ns, end_ns = bounds_around(jetstream.url)
    record = plan_ledger(storage_root, start_ns, end_ns, max_ranges=2, range_messages=60)
    interval = record["interval_id"]
    base = Layout.of(storage_root).ledger_interval_dir("EVENTS", interval)
    assert base.startswith("s3://plgd-test/plgd/_ledger/EVENTS/interval=")
    kw = dict(storage_root=storage_root, ledger=base, row_group_size=10, max_rows_per_file=25)
    first = [run_op(ledger_range=i, batch_size=1000, **kw) for i in range(2)]
    assert [o["count"] for o in first] == [60, 60] and first[0]["root"] == storage_root
    assert first[0]["table"] == f"{storage_root}/staging/EVENTS"
    rows = staging_rows(storage_root, interval_id=interval)
    assert sorted(r["stream_seq"] for r in rows) == list(range(1, 121))
    assert sorted({(r["owner_id"], r["event_type"]) for r in rows}) == sorted(
        (o, t) for o in (O1, O2) for t in ("devicesregistered", "resourcechanged"))
    files = staging.staged_files(Layout.of(storage_root), "EVENTS", interval_id=interval)
    assert len(files) == 8 and all(f.url.startswith(f"{storage_root}/staging/EVENTS/interval_id=") for f in files)
    before = sorted(_digest(f.url).popitem()[1] for f in files)  # 30 rows of a type per range, 25/file

    # a retried task of the same plan: reads and counts again, commits nothing, writes the same record
    second = [run_op(ledger_range=i, batch_size=7, **kw) for i in range(2)]
    assert second == first
    assert staging.staged_files(Layout.of(storage_root), "EVENTS", interval_id=interval) == files
    # a rerun of the interval (a new plan, other fetch batching): new files, byte for byte the same
    plan_ledger(storage_root, start_ns, end_ns, max_ranges=2, range_messages=60)
    third = [run_op(ledger_range=i, batch_size=7, **kw) for i in range(2)]
    assert [o["count"] for o in third] == [60, 60]
    again = staging.staged_files(Layout.of(storage_root), "EVENTS", interval_id=interval)
    assert {f.path for f in again}.isdisjoint(f.path for f in files)
    assert sorted(_digest(f.url).popitem()[1] for f in again) == before
    assert staging_rows(storage_root, interval_id=interval) == rows

    # the summary task: the apps' summaries from the bucket, summary.json written there
    fs, _ = storage.to_fs(storage_root)
    for app, value in {"decode": {"fetched": 120, "decoded": 118, "quarantined": 2, "per_reason": {"x": 2}},
                       "dedupe": {"input": 118, "output": 118, "duplicates": 0}, "rebuild": {"version": 1}}.items():
        fs.pipe_file(storage.to_fs(Layout.of(storage_root).run_summary(app, interval))[1], json.dumps(value).encode())
    summary = collect_run_summary(Layout.of(storage_root), "EVENTS", interval).as_dict()
    assert summary["problems"] == [] and summary["reconciled"] is True
    assert summary["fetched_total"] == 120 and summary["chain"]["stream_total"] == 120
    assert summary["chain"]["kept"] == 118 and summary["chain"]["snapshot_version"] == 1
    assert ledger.read_ledger_file(f"{base}/summary.json")["chain"] == summary["chain"]

    out = capfd.readouterr()
    text = out.out + out.err + caplog.text
    assert storage_root in text
    assert s3.secret_access_key not in text and s3.access_key_id not in text


# ---------------------------------------------------------------------------------------------
# the whole ETL DAG with the root on the bucket (real Airflow, real Spark on Spark Connect)
# ---------------------------------------------------------------------------------------------

def _table_rows(root: str, table: str, interval_id: str) -> list[dict]:
    """The interval's rows of the Delta table ``{root}/{table}`` on the bucket, read with deltalake
    (and polars, checked to agree), sorted."""
    from tests.integration.delta_read import read_both

    rows = read_both(f"{root}/{table}", "stream_seq", interval_id=interval_id)
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def _run_xcoms(dag_run) -> list:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(select(XComModel).where(XComModel.dag_id == dag_run.dag_id,
                                                       XComModel.run_id == dag_run.run_id)).all()
        return [(row.task_id, row.key, XComModel.deserialize_value(row)) for row in rows]


@pytest.mark.spark
@pytest.mark.airflow
def test_etl_dag_on_the_bucket_equals_the_simulator_and_a_rerun_gives_the_same_output(
        jetstream, dags_folder, storage_root, s3, spark_connect_server, monkeypatch, capfd, caplog):
    import time
    from datetime import datetime, timedelta, timezone
    from pathlib import Path

    from airflow_provider_plgd.simulator import SimulationConfig, expected_state, generate, publish
    from plgd_devtools.snapshot_compare import compare_snapshot, read_latest_tables
    from plgd_devtools.spark import spark_lock
    from tests.integration.conftest import load_connect_etl_dag, read_stream, use_spark_connect

    use_spark_connect(monkeypatch, spark_connect_server)
    interval = 8
    dag = load_connect_etl_dag(dags_folder, "plgd_test_s3_etl", interval, storage_roots='["s3://plgd-test"]')

    start_s = (int(time.time() // interval) + 1) * interval
    sim = generate(SimulationConfig(seed=17, owners=3, devices_per_owner=3, resources_per_device=2, intervals=1,
                                    steps_per_interval=200, interval_seconds=interval,
                                    start_time_ns=int(start_s * 1e9)))
    publish(sim, servers=[jetstream.url], stream="EVENTS", wait_for_intervals=True)
    end_s = start_s + interval
    truth = read_stream(jetstream.url)
    assert 200 <= len(truth) <= 1000, len(truth)  # a few hundred messages
    assert all(start_s * 1e9 <= t < end_s * 1e9 for _s, t, _h, _d in truth.values()), \
        "publishing took longer than the interval"
    time.sleep(max(0.0, end_s + 0.5 - time.time()))
    end = datetime.fromtimestamp(end_s, tz=timezone.utc)
    interval_id = times.interval_id(end - timedelta(seconds=interval), end)
    conf = {"storage_root": "s3a://" + storage_root.removeprefix("s3://") + "/", "settle_seconds": 0}

    outputs, runs = [], []
    for _attempt in range(2):  # the run, then a rerun of the same interval (same logical date)
        with spark_lock():
            dr = dag.test(logical_date=end, run_conf=conf)
        runs.append(dr)
        assert "success" in str(dr.state).lower(), dr.state
        summary = ledger.read_ledger_file(f"{Layout.of(storage_root).ledger_interval_dir('EVENTS', interval_id)}/summary.json")
        assert summary["reconciled"] is True and summary["problems"] == []
        assert summary["chain"]["stream_total"] == summary["chain"]["staged"] == len(truth)
        assert compare_snapshot(storage_root, expected_state(sim, through_interval=0)) == []
        outputs.append({"events": _table_rows(storage_root, "events", interval_id),
                        "events_deduped": _table_rows(storage_root, "events_deduped", interval_id),
                        "snapshot": read_latest_tables(storage_root),
                        "staged": [(r["owner_id"], r["event_type"], r["stream_seq"], r["data"])
                                   for r in staging_rows(storage_root, interval_id=interval_id)]})
    assert len(outputs[0]["events"]) == summary["chain"]["kept"] > 0 and len(outputs[0]["staged"]) == len(truth)
    assert outputs[1] == outputs[0]

    # the root is used as s3:// everywhere; no credential in task logs or XCom
    xcoms = [x for dr in runs for x in _run_xcoms(dr)]
    plan = next(v for t, k, v in xcoms if t == "plan" and k == "return_value")
    assert plan["storage_root"] == storage_root
    xcom_text = json.dumps(xcoms, default=str)
    from airflow.configuration import conf as airflow_conf

    log_dir = Path(airflow_conf.get("logging", "base_log_folder"))
    file_logs = "".join(p.read_text(errors="replace") for p in log_dir.rglob("*.log")
                        if "plgd_test_s3_etl" in str(p))
    out = capfd.readouterr()
    logs = out.out + out.err + caplog.text + file_logs
    assert storage_root in logs
    for secret in (s3.secret_access_key, s3.access_key_id):
        assert secret not in xcom_text
        assert secret not in logs


def test_what_other_processes_write_is_seen_at_once(s3, storage_root):
    """s3fs caches every listing per file-system instance; the provider's listings and existence
    checks on an object store must still see what another process (a fetch task, a Spark app)
    wrote after this process listed the folder. Another process is another ``S3FileSystem``
    instance here (``skip_instance_cache``)."""
    import s3fs

    from airflow_provider_plgd.tables.run_summary import read_app_summary

    other = s3fs.S3FileSystem(skip_instance_cache=True)
    interval = "20260101T000000Z_20260101T010000Z"
    base = Layout.of(storage_root).ledger_interval_dir("EVENTS", interval)
    def record(index: int) -> dict:
        rng = ledger.PlanRange(index, 1 + index, 2 + index, 1)
        return ledger.FetchRecord(interval_id=interval, stream="EVENTS", range=rng, staged=1, skipped={},
                                  event_types={}).as_dict()

    ledger.write_ledger_file(f"{base}/fetch/range-00000.json", record(0))
    assert len(ledger.read_records(Layout.of(storage_root), "EVENTS", interval)[1]) == 1
    assert read_app_summary(Layout.of(storage_root), "decode", interval) is None
    assert staging.staged_files(Layout.of(storage_root), "EVENTS") == []

    other.pipe_file(storage.to_fs(f"{base}/fetch/range-00001.json")[1],
                    json.dumps(record(1)).encode())
    other.pipe_file(storage.to_fs(Layout.of(storage_root).run_summary("decode", interval))[1], b'{"fetched": 3}')
    assert len(ledger.read_records(Layout.of(storage_root), "EVENTS", interval)[1]) == 2
    assert read_app_summary(Layout.of(storage_root), "decode", interval) == {"fetched": 3}
    # a staging commit of another process: the next read of the log sees it, and its files
    subprocess.run([sys.executable, "-c", COMMITTING_WRITER.format(repo=REPO, root=storage_root, rows=5, kill_after=0, version=1)],
                   check=True, timeout=120)
    assert sum(f.rows for f in staging.staged_files(Layout.of(storage_root), "EVENTS")) == 5
    assert staging.read_staged(Layout.of(storage_root), "EVENTS", WRITER_INTERVAL).column("stream_seq").to_pylist() == \
        list(range(1, 6))


REPO = str(Path(__file__).resolve().parents[2])
WRITER_INTERVAL = "seq-000000000001-000000001000"
#: A fetch of other uses than the ETL in another process: one owner's batch written and committed,
#: or (``kill_after`` files) SIGKILLed between its files, before its commit.
COMMITTING_WRITER = """
import os, signal, sys
sys.path[:0] = [{repo!r}]
from airflow_provider_plgd.tables import staging, staging_commits
from airflow_provider_plgd.tables.layout import Layout
from airflow_provider_plgd.fetch import stager as stager_module

KILL_AFTER = {kill_after}
real_close = stager_module._File.close
closed = []
def close(self, *args):
    record = real_close(self, *args)
    closed.append(record)
    if len(closed) == KILL_AFTER:
        os.kill(os.getpid(), signal.SIGKILL)
    return record
stager_module._File.close = close
owner = "6ba7b811-9dad-11d1-80b4-00c04fd430c8"
s = stager_module.Stager(stream="EVENTS", spill_dir=None, max_rows_per_file=25, row_group_rows=10)
s.add(owner, "devicesregistered", [(i, "plgd.owners." + owner + ".registrations.devicesregistered",
                                    1767225600000000000 + i, None, b"payload %d" % i) for i in range(1, {rows} + 1)])
records = s.write(Layout.of({root!r}).staging_table("EVENTS"), "seq-000000000001-000000001000",
                  staging.batch_file_prefix(owner, staging.new_write_id()))
staging_commits.commit_batches(Layout.of({root!r}), "EVENTS", "seq-000000000001-000000001000", owner, ["devicesregistered"], records,
                       {version})
"""


def test_a_fetch_killed_between_its_files_leaves_nothing_visible_on_the_bucket(s3, storage_root):
    """A real SIGKILL of a batch rerun between its files (two uploaded, the third open), on S3:
    its files are named by no commit, readers see the first run's rows whole, and the next rerun
    commits byte for byte the first run's file contents."""
    def writer(kill_after: int, version: int) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", COMMITTING_WRITER.format(
            repo=REPO, root=storage_root, rows=60, kill_after=kill_after, version=version)],
            capture_output=True, text=True, timeout=120)

    assert writer(0, 1).returncode == 0
    first = staging.staged_files(Layout.of(storage_root), "EVENTS")
    rows = staging_rows(storage_root)
    digests = sorted(_digest(f.url).popitem()[1] for f in first)
    assert len(first) == 3 and len(rows) == 60

    killed = writer(2, 2)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert staging.staged_files(Layout.of(storage_root), "EVENTS") == first and staging_rows(storage_root) == rows
    fs, path = storage.to_fs(Layout.of(storage_root).staging_table("EVENTS"))
    on_bucket = [p for p in fs.find(path) if p.endswith(".parquet")]
    assert len(on_bucket) == 5  # the two files of the killed run are there, named by no commit

    assert writer(0, 3).returncode == 0
    again = staging.staged_files(Layout.of(storage_root), "EVENTS")
    assert {f.path for f in again}.isdisjoint(f.path for f in first)
    assert sorted(_digest(f.url).popitem()[1] for f in again) == digests and staging_rows(storage_root) == rows
