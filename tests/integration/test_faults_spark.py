"""Fault injection on the Spark side, through real ``spark-submit --master local[2]``.

One simulated dataset (2 intervals, publisher duplicates within and across the interval
boundary, corrupt payloads, lead resource types, an unregistered and re-created device) is
staged with the staging writer (the fetch operator's format). Then, in four sequential
``spark-submit`` processes (each a small driver running the applications in one JVM, like
test_dedupe_rebuild.py):

1. decode/dedupe/rebuild interval 0; decode interval 1 is **SIGKILLed** (whole process group:
   JVM, Python driver and workers) at its output commit;
2. decode interval 1 rerun; dedupe interval 1 killed at its ``events_deduped`` commit (after
   the ``msgid_index`` commit);
3. dedupe interval 1 rerun; rebuild interval 1 killed after writing its bucket files, before
   its snapshot manifest;
4. rebuild interval 1 rerun; decode of a fuzzed staging batch (random bytes, truncations, bit
   flips, bad subjects); decode + dedupe of overlapping durable-consumer batches (redelivery
   after a lost ack); then run A of the concurrency check below.

The kill points are made deterministic by a hook in the driver: at the chosen point it writes a
marker file and sleeps; the test SIGKILLs the process group when the marker appears.
**Concurrency**: process 4 ends with a decode of interval 0 into a second root (run A) that
stops at its commit until a fifth ``spark-submit`` (run B, the same interval) has finished or
has removed one of A's files, then commits: two runs of one interval, deterministically
overlapping.

Every final table is compared with the ground truth: events + quarantine with the staged rows
(one row per staged message, decoded like ``decode_batch`` in-process), ``events_deduped`` with
the simulator's message IDs (one row per ID over all intervals), and every snapshot version
with ``simulator.expected_state``. Spark jobs take ``/tmp/spark.lock`` (shared 2-core machine).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from plgd_devtools.spark import spark_lock, spark_submit_env
from tests.integration.staging_data import stage_simulation

from airflow_provider_plgd import staging, times
from airflow_provider_plgd.plgd.codec import DECODE_ERROR_REASONS
from airflow_provider_plgd.simulator import SimulationConfig, expected_state, generate
from airflow_provider_plgd.spark import schemas, snapshot_store
from airflow_provider_plgd.spark.decode_batch import decode_batch

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
CONFIG = SimulationConfig(seed=17, owners=2, devices_per_owner=4, resources_per_device=2, intervals=2,
                          steps_per_interval=30, duplicates=0.1, corrupt=3, leadrt="first", unregister=True)
BUCKETS = 8
FUZZ_IID = "seq-000000000001-000000000400"
DURABLE_BATCHES = [(1, 20), (1, 30)]  # 1..20 committed but its ack lost; the retry read 1..30

DRIVER = textwrap.dedent('''
    """Runs plgd Spark applications in one JVM with an optional hang point (test_faults_spark.py)."""
    import json, os, sys, time, traceback
    from airflow_provider_plgd import storage
    from airflow_provider_plgd.spark import folders, session
    from airflow_provider_plgd.spark_apps import decode_events, dedupe_events, rebuild_snapshots

    cfg = json.load(open(sys.argv[1]))
    hang = {"point": None}
    real_commit, real_write = folders.commit_folder, storage.write_text

    def reached(point, probe=None):
        """At the armed point: write the marker, then sleep until killed, or (``wait_for``) until
        another run has finished or has removed ``probe`` (a file of this run), and continue."""
        open(cfg["marker"] + ".tmp", "w").write(point)
        os.rename(cfg["marker"] + ".tmp", cfg["marker"])
        if not cfg.get("wait_for"):
            time.sleep(600)
            return
        deadline = time.time() + 90
        while time.time() < deadline and not os.path.exists(cfg["wait_for"]) and (
                probe is None or os.path.exists(probe)):
            time.sleep(0.1)
        time.sleep(1.0)

    def commit_folder(folder, files, **kwargs):
        if hang["point"] and folder.rstrip("/").endswith(hang["point"]):
            reached(hang["point"], os.path.join(folder, files[0]["path"]) if files else None)
        return real_commit(folder, files, **kwargs)

    def write_text(path, text):
        if hang["point"] == "snapshot_manifest" and "/snapshots/v=" in path and path.endswith("/_manifest.json"):
            reached(hang["point"])
        return real_write(path, text)

    folders.commit_folder = commit_folder
    storage.write_text = write_text
    apps = {"decode": decode_events, "dedupe": dedupe_events, "rebuild": rebuild_snapshots}
    spark = session.build_spark_session("plgd-test-faults")
    out = []
    for step in cfg["steps"]:
        hang["point"] = step.get("hang")
        app = apps[step["app"]]
        try:
            out.append({"ok": app.run(spark, app.parse_args(step["argv"]))})
        except Exception as exc:  # recorded for the test (concurrent runs)
            out.append({"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()})
            if not step.get("may_fail"):
                raise
        json.dump(out, open(cfg["out"], "w"), default=str)
    spark.stop()
''')


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------



def _cmd(py_files: str, driver: Path, cfg: Path) -> list[str]:
    spark_submit_bin = shutil.which("spark-submit", path=str(VENV_BIN)) or "spark-submit"
    return [
        spark_submit_bin, "--master", "local[2]", "--py-files", py_files, "--conf", "spark.ui.enabled=false",
        "--conf", "spark.sql.session.timeZone=UTC", "--driver-memory", "1g",
        "--driver-java-options", "-XX:TieredStopAtLevel=1", str(driver), str(cfg)]


class Run:
    """One driver process: ``steps`` = ``[{"app", "argv", "hang"?, "may_fail"?}]``."""

    def __init__(self, base: Path, name: str, py_files: str, steps: list[dict], *, wait_for: Path | None = None):
        self.dir = base / name
        self.dir.mkdir()
        self.marker, self.out, self.log = self.dir / "marker", self.dir / "out.json", self.dir / "spark.log"
        cfg = {"steps": steps, "marker": str(self.marker), "out": str(self.out)}
        if wait_for is not None:
            cfg["wait_for"] = str(wait_for)
        (self.dir / "cfg.json").write_text(json.dumps(cfg))
        (self.dir / "driver.py").write_text(DRIVER)
        self.cmd = _cmd(py_files, self.dir / "driver.py", self.dir / "cfg.json")
        self.proc: subprocess.Popen | None = None

    def start(self) -> Run:
        self._fh = self.log.open("ab")
        self.proc = subprocess.Popen(self.cmd, env=spark_submit_env(), stdout=self._fh, stderr=subprocess.STDOUT,
                                     cwd=self.dir, start_new_session=True)
        return self

    def wait_marker(self, timeout: float = 300) -> str:
        deadline = time.monotonic() + timeout
        while not self.marker.exists():
            if self.proc.poll() is not None:
                pytest.fail(f"{self.dir.name} ended ({self.proc.returncode}) before its hang point:\n{self.tail()}")
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"{self.dir.name}: hang point not reached in {timeout}s:\n{self.tail()}")
            time.sleep(0.05)
        return self.marker.read_text()

    def kill(self) -> None:
        """SIGKILL the whole process group (spark-submit JVM, Python driver and workers)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(60)
        self._fh.close()

    def wait(self, timeout: float = 600, *, check: bool = True) -> list[dict]:
        rc = self.proc.wait(timeout)
        self._fh.close()
        if check and rc != 0:
            pytest.fail(f"{self.dir.name} failed ({rc}):\n{self.tail()}")
        return json.loads(self.out.read_text()) if self.out.exists() else []

    def results(self) -> list[dict]:
        return json.loads(self.out.read_text()) if self.out.exists() else []

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def write_batch(root, owner, event_type, iid, rows, bounds):
    with staging.StagingWriter(root, stream="EVENTS", owner_id=owner, event_type=event_type, interval_id=iid,
                               subject_filters=[f"plgd.owners.{owner}.>"], bounds=bounds) as w:
        w.write(rows)
        return w.commit()


def fuzz_rows(sim, n: int = 400, seed: int = 99) -> list[tuple]:
    """``n`` staging rows: simulator payloads kept valid or mutated (truncated, bit flips, random
    bytes, empty, another subject, a broken subject)."""
    rng = random.Random(seed)
    msgs = [m for m in sim.messages if m.fault is None]
    rows = []
    for seq in range(1, n + 1):
        m = rng.choice(msgs)
        subject, data = m.subject, m.data
        kind = rng.choice(["valid", "truncate", "bitflip", "random", "empty", "other_subject", "bad_subject"])
        if kind == "truncate":
            data = data[: rng.randrange(len(data))]
        elif kind == "bitflip":
            buf = bytearray(data)
            for _ in range(rng.randint(1, 6)):
                bit = rng.randrange(len(buf) * 8)
                buf[bit // 8] ^= 1 << (bit % 8)
            data = bytes(buf)
        elif kind == "random":
            data = rng.randbytes(rng.randrange(120))
        elif kind == "empty":
            data = b""
        elif kind == "other_subject":
            subject = rng.choice(msgs).subject
        elif kind == "bad_subject":
            subject = rng.choice(["plgd.owners", "x.y", subject + ".extra", subject.rsplit(".", 1)[0] + ".nosuch"])
        rows.append((seq, subject, 1_767_225_600_000_000_000 + seq, None, data))
    return rows


def read_dir(path: Path, partitioned: bool) -> list[dict]:
    if not path.exists():
        return []
    part = ds.partitioning(pa.schema([(c, pa.string()) for c in schemas.EVENTS_PARTITION_COLUMNS]),
                           flavor="hive") if partitioned else None
    return ds.dataset(str(path), format="parquet", partitioning=part, exclude_invalid_files=True).to_table().to_pylist()


def staged_table(root: Path, iid: str) -> pa.Table:
    tables = [staging.read_batch(m) for m in staging.list_committed(str(root), "EVENTS", interval_id=iid)]
    return pa.concat_tables(tables).combine_chunks()


def expected_decode(root: Path, iid: str) -> tuple[list, list]:
    """(events keys, quarantine keys) from decoding the staged rows in-process."""
    staged = staged_table(root, iid)
    rows = decode_batch(staged.to_batches()[0], iid).to_pylist() if staged.num_rows else []
    events = sorted((r["stream_seq"], r["msg_id"], r["event_type"]) for r in rows if r["reason"] is None)
    quarantine = sorted((r["stream_seq"], r["reason"]) for r in rows if r["reason"] is not None)
    return events, quarantine


def decoded_keys(root: Path, iid: str) -> tuple[list, list]:
    events = read_dir(root / "events" / f"interval={iid}", True)
    quarantine = read_dir(root / "quarantine" / f"interval={iid}", False)
    return (sorted((r["stream_seq"], r["msg_id"], r["event_type"]) for r in events),
            sorted((r["stream_seq"], r["reason"]) for r in quarantine))


def committed(path: Path) -> bool:
    """A folder is committed when it holds its manifest (``folders.commit_folder``)."""
    return (path / "_manifest.json").exists()


def unnamed_files(folder: Path) -> list[str]:
    """Data files below ``folder`` that its manifest (if any) does not name: invisible to readers."""
    named = set()
    if (folder / "_manifest.json").exists():
        named = {f["path"] for f in json.loads((folder / "_manifest.json").read_text())["files"]}
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*.parquet") if str(p.relative_to(folder)) not in named)


def table_folders(root: Path) -> list[Path]:
    return sorted(p for table in ("events", "quarantine", "events_deduped", "msgid_index")
                  for p in (root / table).glob("interval=*"))


# ---------------------------------------------------------------------------------------------
# the runs
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    from airflow_provider_plgd.spark_deps import build_py_files_zip

    base = tmp_path_factory.mktemp("faults_spark")
    root, fuzz_root, durable_root = base / "data", base / "fuzz", base / "durable"
    sim = generate(CONFIG)
    intervals = stage_simulation(root, sim)
    write_batch(fuzz_root, "fuzz", "mixed", FUZZ_IID, fuzz_rows(sim), {"kind": "seq"})
    for first, last in DURABLE_BATCHES:  # the first 30 published messages, as durable batches
        rows = [(seq, sim.messages[seq - 1].subject, 1_767_225_600_000_000_000 + seq, None, sim.messages[seq - 1].data)
                for seq in range(first, last + 1)]
        write_batch(durable_root, "_filter", "fdurable", times.durable_interval_id(first, last), rows,
                    {"kind": "durable"})
    py_files = build_py_files_zip(base / "py")

    def decode(iid, r=root, **kw):
        return {"app": "decode", "argv": ["--staging-root", str(r), "--interval-id", iid, "--output-root", str(r)], **kw}

    def dedupe(iid, r=root, **kw):
        return {"app": "dedupe", "argv": ["--root", str(r), "--interval-id", iid], **kw}

    def rebuild(iid, end, **kw):
        return {"app": "rebuild", "argv": ["--root", str(root), "--interval-id", iid, "--snapshot-time", end,
                                           "--buckets", str(BUCKETS)], **kw}

    state: dict = {"timings": {}}
    with spark_lock():  # one hold of the shared Spark lock for every run below
        _runs(base, py_files, root, fuzz_root, durable_root, intervals, decode, dedupe, rebuild, state)
    print("faults timings:", state["timings"])

    class F:
        pass

    f = F()
    f.base, f.root, f.fuzz_root, f.durable_root, f.conc_root = base, root, fuzz_root, durable_root, base / "conc"
    f.sim, f.intervals, f.state = sim, intervals, state
    f.durable_ids = sorted(times.durable_interval_id(a, b) for a, b in DURABLE_BATCHES)
    return f


def _runs(base, py_files, root, fuzz_root, durable_root, intervals, decode, dedupe, rebuild, state):
    """The spark-submit processes (the caller holds the Spark lock); results go into ``state``."""
    (i0, e0, _), (i1, e1, end1) = intervals
    v1 = snapshot_store.version_id(end1)
    t = time.monotonic()
    # 1: interval 0 complete; decode 1 killed at its events commit
    run = Run(base, "p1", py_files, [decode(i0), dedupe(i0), rebuild(i0, e0),
                                     decode(i1, hang=f"events/interval={i1}")]).start()
    state["p1_marker"] = run.wait_marker()
    run.kill()
    state["after_decode_kill"] = {
        "events": committed(root / "events" / f"interval={i1}"),
        "quarantine": committed(root / "quarantine" / f"interval={i1}"),
        "unnamed": len(unnamed_files(root / "events" / f"interval={i1}")),
        "summary": (root / "_runs" / "decode" / f"interval={i1}.json").exists()}
    # 2: decode 1 rerun; dedupe 1 killed at the events_deduped commit (msgid_index already committed)
    run = Run(base, "p2", py_files, [decode(i1), dedupe(i1, hang=f"events_deduped/interval={i1}")]).start()
    state["p2_marker"] = run.wait_marker()
    run.kill()
    state["after_dedupe_kill"] = {"deduped": committed(root / "events_deduped" / f"interval={i1}"),
                                  "index": committed(root / "msgid_index" / f"interval={i1}")}
    # 3: dedupe 1 rerun; rebuild 1 killed after its bucket files, before its snapshot manifest
    run = Run(base, "p3", py_files, [dedupe(i1), rebuild(i1, e1, hang="snapshot_manifest")]).start()
    state["p3_marker"] = run.wait_marker()
    run.kill()
    state["after_rebuild_kill"] = {
        "latest": json.loads((root / "snapshots" / "_latest.json").read_text())["version"],
        "v1_manifest": (root / "snapshots" / f"v={v1}" / "_manifest.json").exists(),
        "v1_files": len(list((root / "snapshots").glob(f"v={v1}/r-*/**/*.parquet")))}
    state["timings"]["kills"] = round(time.monotonic() - t, 1)
    # 4: rebuild 1 rerun; fuzzed decode; overlapping durable batches decoded + deduplicated in
    # order; then concurrency run A (decode of interval 0 into a copy), overlapped by run B
    t = time.monotonic()
    conc_root = base / "conc"
    shutil.copytree(root / "staging", conc_root / "staging")
    steps = [rebuild(i1, e1), decode(FUZZ_IID, fuzz_root)]
    for iid in sorted(times.durable_interval_id(a, b) for a, b in DURABLE_BATCHES):
        steps += [decode(iid, durable_root), dedupe(iid, durable_root)]
    steps.append(decode(i0, conc_root, hang=f"events/interval={i0}", may_fail=True))
    run_a = Run(base, "p4", py_files, steps, wait_for=base / "conc_b" / "out.json").start()
    run_a.wait_marker()
    run_b = Run(base, "conc_b", py_files, [decode(i0, conc_root, may_fail=True)]).start()
    state["p4"] = run_a.wait()
    state["conc_a"] = state["p4"][-1:]
    state["conc_b"] = run_b.wait(check=False)
    state["conc_rc"] = (run_a.proc.returncode, run_b.proc.returncode)
    state["timings"]["reruns_fuzz_durable_concurrent"] = round(time.monotonic() - t, 1)


# ---------------------------------------------------------------------------------------------
# kills + reruns
# ---------------------------------------------------------------------------------------------
def test_kills_landed_where_intended_and_left_nothing_half_visible(faults):
    i1 = faults.intervals[1][0]
    s = faults.state
    assert s["p1_marker"] == f"events/interval={i1}"
    assert (s["p2_marker"], s["p3_marker"]) == (f"events_deduped/interval={i1}", "snapshot_manifest")
    # decode killed mid-write (its data files written, no manifest): neither table of the interval
    # committed, no summary; the files it wrote are there but no manifest names them, so no reader
    # of ours sees them (docs/reliability.md, "The commit rule")
    assert s["after_decode_kill"]["events"] is False and s["after_decode_kill"]["quarantine"] is False
    assert s["after_decode_kill"]["summary"] is False
    assert s["after_decode_kill"]["unnamed"] > 0
    # dedupe killed between its two commits: the index is there, the deduplicated events are not
    assert s["after_dedupe_kill"] == {"deduped": False, "index": True}
    # rebuild killed before its manifest: the previous snapshot stays current; its files are unreferenced
    assert s["after_rebuild_kill"]["latest"] == snapshot_store.version_id(faults.intervals[0][2])
    assert s["after_rebuild_kill"]["v1_manifest"] is False and s["after_rebuild_kill"]["v1_files"] > 0
    # the reruns removed what the killed runs left: every committed folder holds exactly the files
    # its manifest names
    folders = table_folders(faults.root)
    assert len(folders) == 8 and all(committed(f) for f in folders)
    assert {str(f.relative_to(faults.root)): unnamed_files(f) for f in folders} == \
        {str(f.relative_to(faults.root)): [] for f in folders}


def test_decode_after_kill_and_rerun_equals_the_staged_rows(faults):
    for iid, _, _ in faults.intervals:
        events, quarantine = decoded_keys(faults.root, iid)
        want_events, want_quarantine = expected_decode(faults.root, iid)
        assert events == want_events, iid
        assert quarantine == want_quarantine, iid
        seqs = [k[0] for k in events] + [k[0] for k in quarantine]
        assert sorted(seqs) == sorted(staged_table(faults.root, iid).column("stream_seq").to_pylist())
        assert len(seqs) == len(set(seqs))  # no row lost, no row doubled
        summary = json.loads((faults.root / "_runs" / "decode" / f"interval={iid}.json").read_text())
        assert summary["fetched"] == summary["decoded"] + summary["quarantined"] == len(seqs)
    assert sum(len(decoded_keys(faults.root, i)[1]) for i, _, _ in faults.intervals) == CONFIG.corrupt


def test_dedupe_after_kill_and_rerun_one_row_per_message_id(faults):
    sim = faults.sim
    all_ids = []
    for k, (iid, _, _) in enumerate(faults.intervals):
        rows = read_dir(faults.root / "events_deduped" / f"interval={iid}", True)
        ids = sorted(r["msg_id"] for r in rows)
        earlier = {m.msg_id for m in sim.messages if m.interval < k and m.msg_id}
        want = sorted({m.msg_id for m in sim.messages if m.interval == k and m.msg_id} - earlier)
        assert ids == want, k
        all_ids += ids
    # every message ID exactly once over all intervals, although the publisher duplicated some
    # messages within and across interval boundaries
    assert sorted(all_ids) == sorted({m.msg_id for m in sim.messages if m.msg_id})
    dups = [m for m in sim.messages if m.fault == "duplicate"]
    assert dups and any(m.interval > min(n.interval for n in sim.messages if n.msg_id == m.msg_id) for m in dups)


def test_snapshots_after_rebuild_kill_and_rerun_equal_ground_truth(faults):
    pointer = json.loads((faults.root / "snapshots" / "_latest.json").read_text())
    assert pointer["version"] == snapshot_store.version_id(faults.intervals[-1][2])
    for k, (iid, _, end_ns) in enumerate(faults.intervals):
        manifest = snapshot_store.read_manifest(str(faults.root), snapshot_store.version_id(end_ns))
        assert manifest["interval_id"] == iid
        expected = expected_state(faults.sim, k)
        for table in snapshot_store.PUBLIC_TABLES:
            got = snapshot_store.read_table(str(faults.root), table, manifest).to_pylist()
            assert got == expected[table], (k, table)
            assert got, (k, table)
    rebuild = faults.state["p4"][0]["ok"]
    assert rebuild["parent"] == snapshot_store.version_id(faults.intervals[0][2])


# ---------------------------------------------------------------------------------------------
# fuzzed payloads through the decode application
# ---------------------------------------------------------------------------------------------
def test_fuzzed_batch_through_the_decode_app_reconciles(faults):
    summary = faults.state["p4"][1]["ok"]
    n = 400
    assert summary["fetched"] == n == summary["decoded"] + summary["quarantined"]
    assert summary["quarantined"] > 100 and summary["decoded"] > 50, summary
    assert set(summary["per_reason"]) <= DECODE_ERROR_REASONS
    events, quarantine = decoded_keys(faults.fuzz_root, FUZZ_IID)
    want_events, want_quarantine = expected_decode(faults.fuzz_root, FUZZ_IID)
    assert events == want_events and quarantine == want_quarantine
    assert sorted(k[0] for k in events + quarantine) == list(range(1, n + 1))
    rows = read_dir(faults.fuzz_root / "quarantine" / f"interval={FUZZ_IID}", False)
    staged = {r["stream_seq"]: r for r in staged_table(faults.fuzz_root, FUZZ_IID).to_pylist()}
    for r in rows:
        assert r["detail"] and r["stage"] == "decode" and r["reason"] in DECODE_ERROR_REASONS
        assert (r["subject"], r["data"]) == (staged[r["stream_seq"]]["subject"], staged[r["stream_seq"]]["data"])
    assert Counter(r["reason"] for r in rows) == Counter(summary["per_reason"])


# ---------------------------------------------------------------------------------------------
# redelivery: overlapping durable batches
# ---------------------------------------------------------------------------------------------
def test_overlapping_durable_batches_are_deduplicated(faults):
    """Batches durable-1-20 (committed, ack lost) and durable-1-30 (the retry, redelivering 1..20):
    decode + dedupe in order keep one row per message ID of messages 1..30."""
    results = faults.state["p4"][2:-1]
    dedupes = [r["ok"] for r in results[1::2]]
    ids = []
    for iid in faults.durable_ids:
        ids += [r["msg_id"] for r in read_dir(faults.durable_root / "events_deduped" / f"interval={iid}", True)]
    want = {m.msg_id for m in faults.sim.messages[:30] if m.msg_id}
    assert sorted(ids) == sorted(want)  # each once
    last = dedupes[-1]
    assert last["interval_id"] == times.durable_interval_id(1, 30)
    assert last["previous_intervals"] == [times.durable_interval_id(1, 20)]
    redelivered = {m.msg_id for m in faults.sim.messages[:20] if m.msg_id}
    assert last["cross_batch_duplicates"] == sum(1 for m in faults.sim.messages[:30] if m.msg_id in redelivered)


# ---------------------------------------------------------------------------------------------
# the same interval decoded twice at once
# ---------------------------------------------------------------------------------------------
def test_concurrent_runs_of_one_interval_leave_correct_output(faults):
    """Whatever happened to each run, the committed tables are complete and correct."""
    i0 = faults.intervals[0][0]
    assert committed(faults.conc_root / "events" / f"interval={i0}")
    assert decoded_keys(faults.conc_root, i0) == expected_decode(faults.root, i0)
    manifest = json.loads((faults.conc_root / "events" / f"interval={i0}" / "_manifest.json").read_text())
    folder = faults.conc_root / "events" / f"interval={i0}"
    assert sorted(f["path"] for f in manifest["files"]) == sorted(
        str(p.relative_to(folder)) for p in folder.rglob("*.parquet"))  # no file missing, none extra


def test_concurrent_second_run_is_refused_clearly_or_both_succeed(faults):
    """Each run either succeeded or failed with an error that says another run holds the interval."""
    outcomes = [faults.state["conc_a"], faults.state["conc_b"]]
    for name, out in zip(("A", "B"), outcomes):
        assert out, f"run {name} wrote no result (rc {faults.state['conc_rc']})"
        if "error" in out[0]:
            assert "another run" in out[0]["error"], f"run {name}: {out[0]['error']}"
