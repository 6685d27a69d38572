"""The fetch's kill matrix and two fetches of one range at once (real nats-server, real processes).

One interval of many owners is planned (``etl.write_interval_ledger``, 2 ranges) and fetched the
way the ETL DAG fetches it (``JetStreamToStagingOperator(ledger=…, ledger_range=…)``), into the
staging Delta table. The reference is an uninterrupted fetch of both ranges.

**Kill matrix** (the pattern of ``test_faults_spark.py``): range 0 is fetched, then range 1 runs
in its own process that SIGKILLs itself at a point, with no hook in the production code: the
process's driver script wraps the function that marks the point:

* ``during_write``: the 2nd ``ParquetWriter.write_table`` of the range's files (a file open, half written);
* ``between_files``: right after the first file is closed (the next one not started);
* ``after_commit``: right after ``staging_commits.commit_range`` returned (before the ledger record).

After each kill, the staging table (read with deltalake and Polars) is exactly its version
before the task, or, after the commit, that version plus the range; files the killed task wrote
but did not commit are on disk and named by no commit; decode's check of the interval refuses it
(no record for range 1). The retry of the task (as Airflow retries it) then gives exactly the rows
and the ledger record of the uninterrupted fetch, and decode's check passes.

**Two fetches of range 0 at once** (a zombie and its retry): both processes stop right before
their commit until both have reached it, then commit: both succeed, the range is committed once
(one task's files, rows not doubled), the other task's files are removed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from airflow_provider_plgd.exceptions import LedgerError
from airflow_provider_plgd.plgd.subjects import registrations_subject, resource_subject
from airflow_provider_plgd.spark.decode_job import ledger_files
from airflow_provider_plgd.tables import ledger, staging
from airflow_provider_plgd.tables.layout import Layout
from tests.integration.conftest import publish_messages
from tests.integration.delta_read import delta_table, polars_frame, staging_rows
from tests.integration.test_ledger import bounds_around, plan_ledger, run_op

REPO = Path(__file__).resolve().parents[2]
OWNERS = [f"{i:08x}-0000-4000-8000-00000000abcd" for i in range(60)]
DEV = "00000000-0000-0000-0000-000000000001"
HREF = "78baefb2-dcdc-50c3-bb55-5ff4c5e4c8b2"
#: Small files and row groups: each range writes several files per event type.
OPTIONS = {"target_file_bytes": 2_000, "row_group_size": 40, "batch_size": 50}
POINTS = ("during_write", "between_files", "after_commit")

DRIVER = textwrap.dedent('''
    """One fetch task of a ledger range, SIGKILLed at a point or stopped before its commit."""
    import json, os, signal, sys, time
    sys.path[:0] = [{repo!r}]
    import pyarrow.parquet as pq
    from airflow_provider_plgd.tables import staging, staging_commits
    from airflow_provider_plgd.fetch import stager
    from airflow_provider_plgd.operators.jetstream_to_staging import JetStreamToStagingOperator

    cfg = json.loads(sys.argv[1])
    point = cfg["point"]

    def die():
        open(cfg["marker"], "w").write(point)
        os.kill(os.getpid(), signal.SIGKILL)

    if point == "during_write":
        real_write, writes = pq.ParquetWriter.write_table, [0]
        def write_table(self, *a, **k):
            writes[0] += 1
            if writes[0] == 2:
                die()
            return real_write(self, *a, **k)
        pq.ParquetWriter.write_table = write_table
    elif point == "between_files":
        real_close = stager._File.close
        def close(self, *a, **k):
            record = real_close(self, *a, **k)
            die()
        stager._File.close = close
    elif point == "after_commit":
        real_commit = staging_commits.commit_range
        def commit_range(*a, **k):
            real_commit(*a, **k)
            die()
        staging_commits.commit_range = commit_range
    elif point == "barrier":  # stop before the commit until every task named in cfg["all"] got there
        real_commit = staging_commits.commit_range
        def commit_range(*a, **k):
            open(cfg["marker"], "w").write("ready")
            deadline = time.time() + 120
            while not all(os.path.exists(m) for m in cfg["all"]) and time.time() < deadline:
                time.sleep(0.01)
            return real_commit(*a, **k)
        staging_commits.commit_range = commit_range
    out = JetStreamToStagingOperator(task_id="fetch", **cfg["kwargs"]).execute({{"params": {{}}}})
    json.dump(out, open(cfg["out"], "w"))
''').format(repo=str(REPO))


def traffic() -> list[tuple]:
    """60 owners interleaved, two event types, payloads of varied sizes (1,200 messages)."""
    out = []
    for i in range(10):
        for k, owner in enumerate(OWNERS):
            out.append((registrations_subject(owner, "devicesregistered"), f"r{i}-{k}".encode() * (1 + k % 7), None))
            out.append((resource_subject(owner, DEV, HREF, "resourcechanged"), bytes([i, k]) * (5 + (i * k) % 40),
                        {"Nats-Msg-Id": f"m-{i}-{k}"} if k % 9 == 0 else None))
    return out


def fetch_kwargs(root: str, record: dict, index: int) -> dict:
    return {"ledger": ledger.interval_dir(Layout.of(root), "EVENTS", record["interval_id"]), "ledger_range": str(index),
            "storage_root": root, **OPTIONS}


def spawn(tmp: Path, name: str, point: str, kwargs: dict, every: list[str] | None = None) -> tuple[subprocess.Popen, Path]:
    folder = tmp / name
    folder.mkdir()
    cfg = {"point": point, "marker": str(folder / "marker"), "out": str(folder / "out.json"), "kwargs": kwargs,
           "all": every or []}
    log = (folder / "log").open("w")
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(cfg)], stdout=log, stderr=subprocess.STDOUT)
    return proc, folder


def state(root: str) -> dict:
    """What readers see of the staging table: version, files the log names, Parquet files on disk, rows."""
    table = Path(staging.table_uri(Layout.of(root), "EVENTS"))
    dt = delta_table(str(table))
    rows = sorted((r["owner_id"], r["event_type"], r["stream_seq"], r["data"]) for r in staging_rows(root))
    assert polars_frame(str(table)).height == len(rows)
    return {"version": dt.version(), "files": sorted(f.path for f in staging.staged_files(Layout.of(root), "EVENTS")),
            "disk": sorted(str(p.relative_to(table)) for p in table.rglob("*.parquet")), "rows": rows}


def record_of(root: str, record: dict, index: int) -> dict | None:
    return ledger.read_ledger_file(f"{ledger.interval_dir(Layout.of(root), 'EVENTS', record['interval_id'])}/fetch/"
                            f"{ledger.range_record_name(index)}")


def comparable(rec: dict) -> dict:
    """A fetch record without what differs between runs (the plan's run version, the Delta version)."""
    return {k: v for k, v in rec.items() if k not in ("run_version", "delta_version")}


@pytest.fixture(scope="module")
def fetch_faults(nats_server, tmp_path_factory):
    from plgd_devtools.nats_server import recreate_stream

    mp = pytest.MonkeyPatch()
    mp.setenv("AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT", json.dumps(
        {"conn_type": "plgd_jetstream", "host": nats_server.host, "port": nats_server.port,
         "extra": {"stream": "EVENTS"}}))
    nats_server.start()
    recreate_stream(nats_server.url)
    tmp = tmp_path_factory.mktemp("faults_fetch")
    try:
        publish_messages(nats_server.url, traffic())
        start_ns, end_ns = bounds_around(nats_server.url)
        result: dict = {"kills": {}}

        def plan(root: str) -> dict:
            return plan_ledger(root, start_ns, end_ns, max_ranges=2, range_messages=600)

        # the reference: both ranges, uninterrupted
        ref_root = str(tmp / "reference")
        ref = plan(ref_root)
        result["reference"] = {"record": ref, "outs": [run_op(**fetch_kwargs(ref_root, ref, i)) for i in range(2)],
                               "state": state(ref_root), "records": [record_of(ref_root, ref, i) for i in range(2)],
                               "root": ref_root}
        # the kill matrix: range 0, then range 1 killed at each point, then its retry
        for point in POINTS:
            root = str(tmp / f"kill-{point}")
            record = plan(root)
            run_op(**fetch_kwargs(root, record, 0))
            before = state(root)
            proc, folder = spawn(tmp, f"p-{point}", point, fetch_kwargs(root, record, 1))
            rc = proc.wait(120)
            kill = {"rc": rc, "marker": (folder / "marker").read_text() if (folder / "marker").exists() else None,
                    "log": (folder / "log").read_text()[-3000:], "before": before, "seen": state(root),
                    "record_after_kill": record_of(root, record, 1), "record": record, "root": root}
            try:
                ledger_files(Layout.of(root), "EVENTS", record["interval_id"])
            except LedgerError as exc:
                kill["decode_refused"] = str(exc)
            kill["retry"] = run_op(**fetch_kwargs(root, record, 1))
            kill["after"] = state(root)
            kill["records"] = [record_of(root, record, i) for i in range(2)]
            kill["decode_files"] = ledger_files(Layout.of(root), "EVENTS", record["interval_id"])
            result["kills"][point] = kill
        # two fetches of range 0 at once
        root = str(tmp / "concurrent")
        record = plan(root)
        markers = [str(tmp / f"c-{n}" / "marker") for n in "ab"]
        procs = [spawn(tmp, f"c-{n}", "barrier", fetch_kwargs(root, record, 0), markers) for n in "ab"]
        result["concurrent"] = {"rcs": [p.wait(180) for p, _ in procs], "root": root, "record": record,
                                "outs": [json.loads((f / "out.json").read_text()) if (f / "out.json").exists() else None
                                         for _, f in procs],
                                "logs": [(f / "log").read_text()[-3000:] for _, f in procs], "state": state(root)}
        yield result
    finally:
        mp.undo()


def test_the_reference_fetch_stages_every_message_once_sorted_in_files_per_range_and_event_type(fetch_faults):
    ref = fetch_faults["reference"]
    rows = ref["state"]["rows"]
    assert len(rows) == len({r[2] for r in rows}) == 1200 and [o["count"] for o in ref["outs"]] == [600, 600]
    files = staging.staged_files(Layout.of(ref["root"]), "EVENTS")
    per_place: dict[tuple, list] = {}
    for f in files:
        per_place.setdefault((staging.file_range(f.path)[0], f.event_type), []).append(f)
    assert sorted(per_place) == [(r, t) for r in (0, 1) for t in ("devicesregistered", "resourcechanged")]
    for (index, event_type), mine in per_place.items():
        payload = ref["records"][index]["event_types"][event_type]["bytes"]
        assert 1 < len(mine) <= -(-payload // OPTIONS["target_file_bytes"])  # ceil(bytes / target size)


@pytest.mark.parametrize("point", POINTS)
def test_a_fetch_killed_at_each_point_leaves_staging_old_or_new_and_decode_refuses_it(fetch_faults, point):
    kill = fetch_faults["kills"][point]
    assert (kill["rc"], kill["marker"]) == (-9, point), kill["log"]
    before, seen = kill["before"], kill["seen"]
    ref_rows = fetch_faults["reference"]["state"]["rows"]
    assert kill["record_after_kill"] is None  # the ledger record is written after the commit
    assert "range 1" in kill["decode_refused"] and "no fetch task recorded it" in kill["decode_refused"]
    leftovers = sorted(set(seen["disk"]) - set(seen["files"]))
    if point == "after_commit":  # the range is committed, whole: the table is the earlier version plus the range
        assert seen["version"] == before["version"] + 1 and seen["rows"] == ref_rows
        assert leftovers == []
    else:  # nothing of range 1 is visible
        assert (seen["version"], seen["files"], seen["rows"]) == (before["version"], before["files"], before["rows"])
        assert leftovers and all(staging.file_range(p)[0] == 1 for p in leftovers)  # written, named by no commit


@pytest.mark.parametrize("point", POINTS)
def test_the_retry_after_each_kill_equals_an_uninterrupted_fetch(fetch_faults, point):
    kill, ref = fetch_faults["kills"][point], fetch_faults["reference"]
    after = kill["after"]
    assert after["rows"] == ref["state"]["rows"]  # every message once: no gap, nothing doubled
    assert [comparable(r) for r in kill["records"]] == [comparable(r) for r in ref["records"]]
    assert sum(f.rows for f in kill["decode_files"]) == 1200  # decode's check of the ledger passes
    retry = kill["retry"]
    assert (retry["count"], retry["owners"], retry["batches"]) == (ref["outs"][1]["count"], ref["outs"][1]["owners"],
                                                                  ref["outs"][1]["batches"])
    if point == "after_commit":  # the retry read and counted the range, and committed nothing
        assert after["version"] == kill["seen"]["version"] and after["files"] == kill["seen"]["files"]
        assert retry["delta_version"] == kill["seen"]["version"] == kill["records"][1]["delta_version"]
    else:
        assert after["version"] == kill["before"]["version"] + 1


def test_two_fetches_of_one_range_at_once_commit_it_once(fetch_faults):
    conc = fetch_faults["concurrent"]
    assert conc["rcs"] == [0, 0], conc["logs"]
    a, b = conc["outs"]
    assert a["count"] == b["count"] == 600 and a["files"] == b["files"]
    seen = conc["state"]
    ref_range0 = [r for r in fetch_faults["reference"]["state"]["rows"]
                  if r[2] < fetch_faults["reference"]["record"]["ranges"][1]["first_seq"]]
    assert seen["rows"] == ref_range0  # once, not doubled
    write_ids = {p.rsplit("/", 1)[-1].split("-")[2] for p in seen["files"]}
    assert len(write_ids) == 1  # the files of one task
    assert seen["disk"] == seen["files"]  # the other task removed its own files
    table = delta_table(staging.table_uri(Layout.of(conc["root"]), "EVENTS"))
    commits = [h for h in table.history() if "fetch_range" in json.dumps(h.get("plgd") or "")]
    assert len(commits) == 1 and a["delta_version"] == b["delta_version"] == commits[0]["version"]
