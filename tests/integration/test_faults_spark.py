"""Fault injection on the Spark side, through real ``spark-submit --master local[1]``.

One simulated dataset (2 intervals, publisher duplicates within and across the interval
boundary, corrupt payloads, lead resource types, an unregistered and re-created device) is
staged with the fetch's writer and commit (the staging Delta table). The fetch's own kill matrix is
``tests/integration/test_faults_fetch.py``. The output tables are Delta
tables (``airflow_provider_plgd.tables.delta_tables``); every check below reads them with
``deltalake.DeltaTable`` (and Polars' ``read_delta``), never with the project's own readers.

**The reference chain** (uninterrupted runs, each root a copy of the one before): ``B0`` =
decode + dedupe + rebuild of interval 0; ``B1`` = ``B0`` + decode of interval 1; ``B2`` = ``B1``
+ dedupe of interval 1; ``B3`` = ``B2`` + rebuild of interval 1. It runs as one client of the
session's Spark Connect server (``spark_connect_server``): it is the yardstick, not a kill; the
killed runs and their reruns are ``spark-submit`` processes, and their rows must equal it. ``B3`` is compared with the
ground truth: events + quarantine with the staged rows (decoded like ``decode_batch``
in-process), ``events_deduped`` with the simulator's message IDs, every snapshot with
``simulator.expected_state``.

**The kill matrix**: decode, dedupe and rebuild of interval 1, each run on a fresh copy of the
root before it (``B0``, ``B1``, ``B2``), are SIGKILLed -- every process of the ``spark-submit``
session: JVM, Python driver, PySpark daemon and workers -- at each :data:`KILL_POINTS` point:
before writing data files, while writing them, after writing them (before the first Delta
commit), between two commits, (rebuild) before the ``_device_state`` commit, and after the last
commit (before the run summary). The points are deterministic: the test's driver script
(:data:`DRIVER`) imports the applications and wraps the function that marks the point (e.g. the
Nth ``delta_tables.commit_files`` call, or in the executor the 2nd ``ParquetWriter.write_table``)
so that it writes a marker file and kills the session. The production code has no hook.

After each kill, per table: the Delta reader sees either exactly the previous version (the copy's
source: same version, same files, same rows) or exactly the new one (the rows of the reference
chain's next root), as the app's commit order says; every file the log names is on disk; the
files the killed run wrote but did not commit are on disk and read by no one. The next
``spark-submit`` process first reruns the killed app on the same copy, and the rerun's rows equal
the reference chain's (every table).

Then fuzzed payloads, overlapping durable batches (redelivery after a lost ack), and two runs of
one interval at once (run A stops at its commit until run B has finished). Spark jobs take
``/tmp/spark.lock`` (shared 2-core machine).
"""

from __future__ import annotations

import contextlib
import functools
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
from urllib.parse import unquote

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_provider_plgd import times
from airflow_provider_plgd.plgd.codec import DECODE_ERROR_REASONS
from airflow_provider_plgd.simulator import SimulationConfig, expected_state, generate
from airflow_provider_plgd.spark.decode_batch import decode_batch
from airflow_provider_plgd.tables import snapshot_store, staging
from airflow_provider_plgd.tables.layout import Layout
from plgd_devtools.spark import FAST_LOCAL_SPARK_CONF, spark_lock, spark_submit_env
from tests.integration.conftest import run_connect_client
from tests.integration.delta_read import staging_rows
from tests.integration.staging_data import stage_simulation, write_batches

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
CONFIG = SimulationConfig(seed=17, owners=2, devices_per_owner=4, resources_per_device=2, intervals=2,
                          steps_per_interval=30, duplicates=0.1, corrupt=3, leadrt="first", unregister=True)
BUCKETS = 8
FUZZ_IID = "seq-000000000001-000000000400"
DURABLE_BATCHES = [(1, 20), (1, 30)]  # 1..20 committed but its ack lost; the retry read 1..30

#: Every table of a root, as folders below it.
TABLES = ("events", "quarantine", "events_deduped", "msgid_index",
          *(f"snapshots/{t}" for t in snapshot_store.ALL_TABLES))
#: The tables each app commits, in its commit order.
COMMIT_ORDER = {
    "decode": ["events", "quarantine"],
    "dedupe": ["msgid_index", "events_deduped"],
    "rebuild": [f"snapshots/{t}" for t in snapshot_store.ALL_TABLES],  # the public tables, _device_state last
}
#: ``{app: [(point, where, target, nth)]}``: the process dies when ``target`` (``module.function``
#: of the app's package) is called the ``nth`` time in the driver, or (``worker``) at the ``nth``
#: ``ParquetWriter.write_table`` of a task of the executor whose task factory is ``target``.
KILL_POINTS = {
    "decode": [
        ("before_write", "driver", "decode_job.make_rdd_task", 1),
        ("during_write", "worker", "decode_job.make_rdd_task", 2),
        ("after_write", "driver", "delta_tables.commit_files", 1),
        ("between_commits", "driver", "delta_tables.commit_files", 2),
        ("after_last_commit", "driver", "decode_job.finish_run", 1),
    ],
    "dedupe": [
        ("before_write", "driver", "dedupe_job.dedupe_on_executors", 1),  # no file written yet
        ("during_write", "worker", "dedupe_job.make_copy_task", 2),  # msgid_index files written, events_deduped part
        ("after_write", "driver", "delta_tables.commit_files", 1),
        ("between_commits", "driver", "delta_tables.commit_files", 2),
        ("after_last_commit", "driver", "dedupe_job.finish_run", 1),
    ],
    "rebuild": [
        ("before_write", "driver", "rebuild_input.fold_touched_buckets", 1),
        ("during_write", "worker", "rebuild_input.make_reduce_task", 2),
        ("after_write", "driver", "delta_tables.commit_files", 1),
        ("between_commits", "driver", "delta_tables.commit_files", 2),
        ("before_last_commit", "driver", "delta_tables.commit_files", len(snapshot_store.ALL_TABLES)),
        ("after_last_commit", "driver", "rebuild_job.finish_run", 1),
    ],
}


def committed_by_kill(app: str, point: str) -> list[str]:
    """The tables that a run of ``app`` killed at ``point`` had committed."""
    order = COMMIT_ORDER[app]
    return {"between_commits": order[:1], "before_last_commit": order[:-1],
            "after_last_commit": order}.get(point, [])


DRIVER = textwrap.dedent('''
    """Runs plgd Spark applications in one JVM; a step may be armed to kill the whole
    spark-submit session, or to wait, at a chosen point (test_faults_spark.py)."""
    import json, os, shutil, signal, sys, time, traceback
    from airflow_provider_plgd.tables import delta_tables
    from airflow_provider_plgd.spark import decode_job, dedupe_job, rebuild_input, rebuild_job, session
    from airflow_provider_plgd.spark_apps import decode_events, dedupe_events, rebuild_snapshots

    cfg = json.load(open(sys.argv[1]))
    MODULES = {"delta_tables": delta_tables, "decode_job": decode_job, "dedupe_job": dedupe_job,
               "rebuild_input": rebuild_input, "rebuild_job": rebuild_job}

    def die(point, marker=cfg["marker"]):
        """Write the marker, then SIGKILL every process of this spark-submit session (JVM,
        Python driver, PySpark daemon and workers), this one last."""
        import os, signal
        with open(marker + ".tmp", "w") as fh:
            fh.write(point)
        os.rename(marker + ".tmp", marker)
        sid, me = os.getsid(0), os.getpid()
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == me:
                continue
            try:
                with open(f"/proc/{name}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                if int(fields[3]) == sid:
                    os.kill(int(name), signal.SIGKILL)
            except (OSError, ValueError, IndexError):
                pass
        os.kill(me, signal.SIGKILL)

    def wait(point):
        """Write the marker, then wait until another run has finished (cfg wait_for), and go on."""
        open(cfg["marker"] + ".tmp", "w").write(point)
        os.rename(cfg["marker"] + ".tmp", cfg["marker"])
        deadline = time.time() + 120
        while time.time() < deadline and not os.path.exists(cfg["wait_for"]):
            time.sleep(0.1)
        time.sleep(1.0)

    def arm(point, where, target, nth, action="die"):
        """Wrap MODULES[module].function (target "module.function"); return the undo."""
        module, name = target.split(".")
        module = MODULES[module]
        real = getattr(module, name)
        calls = [0]
        if where == "driver":
            def hooked(*args, **kwargs):
                calls[0] += 1
                if calls[0] == nth:
                    (die if action == "die" else wait)(point)
                return real(*args, **kwargs)
        else:  # a task factory: its tasks die at the nth ParquetWriter.write_table of their worker
            def hooked(*args, **kwargs):
                task = real(*args, **kwargs)

                def killing_task(iterator):
                    import pyarrow.parquet as pq
                    write = pq.ParquetWriter.write_table
                    writes = [0]

                    def write_table(self, *a, **k):
                        writes[0] += 1
                        if writes[0] == nth:
                            die(point)
                        return write(self, *a, **k)

                    pq.ParquetWriter.write_table = write_table
                    try:
                        yield from task(iterator)
                    finally:
                        pq.ParquetWriter.write_table = write
                return killing_task
        setattr(module, name, hooked)
        return lambda: setattr(module, name, real)

    apps = {"decode": decode_events, "dedupe": dedupe_events, "rebuild": rebuild_snapshots}
    spark = session.build_spark_session("plgd-test-faults")
    session.ship_code(spark)  # on Spark Connect (the reference chain): the server's workers have no provider
    out = []
    for step in cfg["steps"]:
        if "copy" in step:
            shutil.copytree(*step["copy"])
            continue
        undo = arm(**step["arm"]) if step.get("arm") else None
        app = apps[step["app"]]
        try:
            out.append({"ok": app.run(spark, app.parse_args(step["argv"]))})
        except Exception as exc:  # recorded for the test (concurrent runs)
            out.append({"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()})
            if not step.get("may_fail"):
                raise
        finally:
            if undo:
                undo()
        json.dump(out, open(cfg["out"], "w"), default=str)
    spark.stop()
''')


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def _cmd(py_files: str, driver: Path, cfg: Path) -> list[str]:
    spark_submit_bin = shutil.which("spark-submit", path=str(VENV_BIN)) or "spark-submit"
    # the short-run settings of the Airflow tests' DAGs (C1 JIT, serial GC, no code generation):
    # 17 JVMs start here, each a short run on small data
    conf = {**FAST_LOCAL_SPARK_CONF, "spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC"}
    return [spark_submit_bin, "--master", "local[1]", "--py-files", py_files,
            *(arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")),
            "--driver-memory", "1g", str(driver), str(cfg)]


def _session_pids(sid: int) -> list[int]:
    """The processes of session ``sid`` (the spark-submit this test started with start_new_session)."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[3]) == sid:
                pids.append(int(name))
    return pids


class Run:
    """One driver process: ``steps`` = ``[{"app", "argv", "arm"?, "may_fail"?} | {"copy": [src, dst]}]``."""

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
                self.reap()
                pytest.fail(f"{self.dir.name}: hang point not reached in {timeout}s:\n{self.tail()}")
            time.sleep(0.05)
        return self.marker.read_text()

    def wait_killed(self, timeout: float = 300) -> tuple[str, int]:
        """Wait until the process killed itself at its armed point: ``(marker, return code)``."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.reap()
            pytest.fail(f"{self.dir.name}: not killed in {timeout}s:\n{self.tail()}")
        self.reap()
        if not self.marker.exists():
            pytest.fail(f"{self.dir.name} ended ({rc}) without reaching its kill point:\n{self.tail()}")
        return self.marker.read_text(), rc

    def reap(self) -> None:
        """SIGKILL whatever is left of this run's session (by process ID), then reap the process."""
        for pid in _session_pids(self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(60)
        self._fh.close()

    def wait(self, timeout: float = 600, *, check: bool = True) -> list[dict]:
        rc = self.proc.wait(timeout)
        self._fh.close()
        if check and rc != 0:
            pytest.fail(f"{self.dir.name} failed ({rc}):\n{self.tail()}")
        return json.loads(self.out.read_text()) if self.out.exists() else []

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def write_batch(root, owner, event_type, iid, rows):
    return write_batches(root, iid, {(owner, event_type): rows})


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


def read_delta(folder: Path, interval_id: str | None = None) -> list[dict]:
    """The rows of the Delta table at ``folder`` (latest version; ``deltalake``), of one interval."""
    if not (folder / "_delta_log").is_dir():
        return []
    rows = DeltaTable(str(folder)).to_pyarrow_table().to_pylist()
    return [r for r in rows if interval_id is None or r["interval_id"] == interval_id]


def staged_table(root: Path, iid: str) -> pa.Table:
    """The staged rows of an interval (deltalake), as a table of the message columns."""
    rows = staging_rows(root, interval_id=iid)
    return pa.Table.from_pylist([{n: r[n] for n in staging.SCHEMA.names} for r in rows],
                                schema=staging.SCHEMA).combine_chunks()


def expected_decode(root: Path, iid: str) -> tuple[list, list]:
    """(events keys, quarantine keys) from decoding the staged rows in-process."""
    staged = staged_table(root, iid)
    rows = decode_batch(staged.to_batches()[0], iid).to_pylist() if staged.num_rows else []
    events = sorted((r["stream_seq"], r["msg_id"], r["event_type"]) for r in rows if r["reason"] is None)
    quarantine = sorted((r["stream_seq"], r["reason"]) for r in rows if r["reason"] is not None)
    return events, quarantine


def decoded_keys(root: Path, iid: str) -> tuple[list, list]:
    events = read_delta(root / "events", iid)
    quarantine = read_delta(root / "quarantine", iid)
    return (sorted((r["stream_seq"], r["msg_id"], r["event_type"]) for r in events),
            sorted((r["stream_seq"], r["reason"]) for r in quarantine))


def _relative(folder: Path, uri: str) -> str:
    path = uri[len("file://"):] if uri.startswith("file://") else uri
    return str(Path(unquote(path)).relative_to(folder))


def table_state(root: Path, name: str) -> dict:
    """What readers see of table ``name`` under ``root``: Delta ``version``, its ``rows`` (canonical
    JSON, sorted), the data ``files`` its log names, the Parquet files on ``disk`` (paths relative to
    the table) and the row count Polars' ``read_delta`` sees."""
    folder = root / name
    disk = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.parquet")
                  if "_delta_log" not in p.parts) if folder.exists() else []
    if not (folder / "_delta_log").is_dir():
        return {"version": None, "rows": [], "files": [], "disk": disk, "polars_rows": 0}
    dt = DeltaTable(str(folder))
    rows = sorted(json.dumps(r, sort_keys=True, default=repr) for r in dt.to_pyarrow_table().to_pylist())
    return {"version": dt.version(), "rows": rows, "files": sorted(_relative(folder, u) for u in dt.file_uris()),
            "disk": disk, "polars_rows": pl.read_delta(str(folder)).height}


def observe(root: Path) -> dict[str, dict]:
    return {name: table_state(root, name) for name in TABLES}


@functools.cache
def observe_reference(root: Path) -> dict[str, dict]:
    """:func:`observe` of a root of the reference chain (never written after the fixture)."""
    return observe(root)


def summary_file(root: Path, app: str, iid: str) -> Path:
    return root / "_runs" / app / f"interval={iid}.json"


# ---------------------------------------------------------------------------------------------
# the runs
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def faults(tmp_path_factory, spark_connect_server):
    from airflow_provider_plgd.spark_deps import build_py_files_zip

    base = tmp_path_factory.mktemp("faults_spark")
    chain = [base / f"B{k}" for k in range(4)]
    fuzz_root, durable_root = base / "fuzz", base / "durable"
    sim = generate(CONFIG)
    intervals = stage_simulation(chain[0], sim)
    write_batch(fuzz_root, "fuzz", "mixed", FUZZ_IID, fuzz_rows(sim))
    for first, last in DURABLE_BATCHES:  # the first 30 published messages, as durable batches
        rows = [(seq, sim.messages[seq - 1].subject, 1_767_225_600_000_000_000 + seq, None, sim.messages[seq - 1].data)
                for seq in range(first, last + 1)]
        write_batch(durable_root, "_filter", "fdurable", times.durable_interval_id(first, last), rows)
    py_files = build_py_files_zip(base / "py")

    state: dict = {"timings": {}, "kills": {}}
    t = time.monotonic()
    with spark_lock():  # one hold of the shared Spark lock for every run below
        state["timings"]["waiting_for_the_spark_lock"] = round(time.monotonic() - t, 1)
        _runs(base, py_files, chain, fuzz_root, durable_root, intervals, state, spark_connect_server)
    print("faults timings:", state["timings"])

    class F:
        pass

    f = F()
    f.base, f.chain, f.root, f.fuzz_root, f.durable_root = base, chain, chain[3], fuzz_root, durable_root
    f.conc_root = base / "conc"
    f.sim, f.intervals, f.state = sim, intervals, state
    f.durable_ids = sorted(times.durable_interval_id(a, b) for a, b in DURABLE_BATCHES)
    return f


def _step(app: str, root: Path, intervals, k: int, **kw) -> dict:
    """The argv of ``app`` for interval ``k`` on ``root``."""
    iid, end, _ = intervals[k]
    return _app_step(app, root, iid, end, **kw)


def _app_step(app: str, root: Path, iid: str, end: str | None = None, **kw) -> dict:
    argv = {"decode": ["--root", str(root), "--interval-id", iid],
            "dedupe": ["--root", str(root), "--interval-id", iid],
            "rebuild": ["--root", str(root), "--interval-id", iid, "--snapshot-time", str(end),
                        "--buckets", str(BUCKETS)]}[app]
    return {"app": app, "argv": argv, **kw}


def _kill(base: Path, py_files: str, app: str, kill_point: tuple, intervals, source: Path, steps: list[dict],
          state: dict) -> list[dict]:
    """One spark-submit: ``steps``, then ``app`` on a fresh copy of ``source``, killed at
    ``kill_point``; record what readers see in ``state``. Return the rerun step (on that copy)."""
    point, where, target, nth = kill_point
    root = base / f"kill-{app}-{point}"
    steps = [*steps, {"copy": [str(source), str(root)]},
             _step(app, root, intervals, 1, arm={"point": point, "where": where, "target": target, "nth": nth})]
    marker, rc = Run(base, f"p-{app}-{point}", py_files, steps).start().wait_killed()
    state["kills"][(app, point)] = {"marker": marker, "rc": rc, "root": root, "seen": observe(root),
                                    "latest": (snapshot_store.latest(Layout.of(str(root))) or {}).get("version"),
                                    "snapshot": {t: snapshot_store.read_snapshot(str(root), t).to_pylist()
                                                 for t in snapshot_store.PUBLIC_TABLES},
                                    "summary": summary_file(root, app, intervals[1][0]).exists()}
    return [_step(app, root, intervals, 1)]


def _kill_chain(base, py_files, app, points, intervals, source, steps, state) -> list[dict]:
    """The kill ``points`` of ``app``, one process each; each process first reruns the app killed in
    the one before (``steps``). Return the rerun step of the last kill."""
    for kill_point in points:
        steps = _kill(base, py_files, app, kill_point, intervals, source, steps, state)
    return steps


def _runs(base, py_files, chain, fuzz_root, durable_root, intervals, state, connect_server):
    """The reference chain on Spark Connect, then the spark-submit processes (the caller holds the
    Spark lock); results go into ``state``."""
    b0, b1, b2, b3 = chain
    before = {"decode": b0, "dedupe": b1, "rebuild": b2}
    t = time.monotonic()
    reference = base / "reference"
    reference.mkdir()
    (reference / "cfg.json").write_text(json.dumps({"marker": str(reference / "marker"), "out": str(reference / "out.json"),
        "steps": [_step("decode", b0, intervals, 0), _step("dedupe", b0, intervals, 0),
                  _step("rebuild", b0, intervals, 0),
                  {"copy": [str(b0), str(b1)]}, _step("decode", b1, intervals, 1),
                  {"copy": [str(b1), str(b2)]}, _step("dedupe", b2, intervals, 1),
                  {"copy": [str(b2), str(b3)]}, _step("rebuild", b3, intervals, 1)]}))
    (reference / "driver.py").write_text(DRIVER)
    run_connect_client(connect_server, reference / "driver.py", str(reference / "cfg.json"),
                       log=reference / "client.log")
    state["timings"]["reference_on_connect"] = round(time.monotonic() - t, 1)
    t = time.monotonic()
    # the kill matrix: each process reruns the app killed in the one before (on that run's copy)
    # and then runs the next armed app on a fresh copy. (The three apps' chains side by side in
    # threads were no faster on 2 cores.)
    steps: list[dict] = []
    for app, points in KILL_POINTS.items():
        steps = _kill_chain(base, py_files, app, points, intervals, before[app], steps, state)
    state["timings"]["kills"] = round(time.monotonic() - t, 1)
    # last: the rerun of the last kill; fuzzed decode; overlapping durable batches decoded +
    # deduplicated in order; then concurrency run A (decode of interval 0 into a copy), overlapped by run B
    t = time.monotonic()
    conc_root = base / "conc"
    shutil.copytree(b0 / "staging", conc_root / "staging")
    steps += [_app_step("decode", fuzz_root, FUZZ_IID)]
    for iid in sorted(times.durable_interval_id(a, b) for a, b in DURABLE_BATCHES):
        steps += [_app_step("decode", durable_root, iid), _app_step("dedupe", durable_root, iid)]
    steps.append(_step("decode", conc_root, intervals, 0, may_fail=True,
                       arm={"point": "commit:events", "where": "driver", "target": "delta_tables.commit_files",
                            "nth": 1, "action": "wait"}))
    run_a = Run(base, "p-last", py_files, steps, wait_for=base / "conc_b" / "out.json").start()
    run_a.wait_marker()
    run_b = Run(base, "conc_b", py_files, [_step("decode", conc_root, intervals, 0, may_fail=True)]).start()
    state["last"] = run_a.wait()
    state["conc_a"] = state["last"][-1:]
    state["conc_b"] = run_b.wait(check=False)
    state["conc_rc"] = (run_a.proc.returncode, run_b.proc.returncode)
    state["timings"]["rerun_fuzz_durable_concurrent"] = round(time.monotonic() - t, 1)


# ---------------------------------------------------------------------------------------------
# the kill matrix
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("app", list(KILL_POINTS))
def test_kill_matrix_leaves_each_table_entirely_old_or_entirely_new(faults, app):
    """After a SIGKILL at each point, every table is either exactly its previous version (same
    Delta version, files and rows) or exactly the new one (the rows of an uninterrupted run), as
    far as the app's commit order got; no reader sees a file the log does not name."""
    b = faults.chain
    old_root, new_root = {"decode": (b[0], b[1]), "dedupe": (b[1], b[2]), "rebuild": (b[2], b[3])}[app]
    old, new = observe_reference(old_root), observe_reference(new_root)
    v0, v1 = (snapshot_store.version_id(end) for _, _, end in faults.intervals)
    for point, *_ in KILL_POINTS[app]:
        kill = faults.state["kills"][(app, point)]
        assert (kill["marker"], kill["rc"]) == (point, -signal.SIGKILL), (app, point)
        committed = committed_by_kill(app, point)
        for name, seen in kill["seen"].items():
            where = (app, point, name)
            assert set(seen["files"]) <= set(seen["disk"]), where  # every named file is there
            assert seen["polars_rows"] == len(seen["rows"]), where  # Polars reads the same version
            if name in committed:  # entirely the new version
                assert seen["version"] > old[name]["version"], where
                assert seen["rows"] == new[name]["rows"], where
            else:  # entirely the previous version
                assert (seen["version"], seen["files"]) == (old[name]["version"], old[name]["files"]), where
                assert seen["rows"] == old[name]["rows"], where
        # what the killed run wrote: nothing before writing; afterwards files no commit names
        # (nor will: the rerun writes its own), on disk but read by no one
        leftovers = {name: sorted(set(seen["disk"]) - set(seen["files"]) - set(old[name]["disk"]))
                     for name, seen in kill["seen"].items()}
        if point in ("before_write", "after_last_commit"):  # nothing written yet / everything committed
            assert not any(leftovers.values()), (app, point, leftovers)
        else:
            assert any(leftovers[name] for name in COMMIT_ORDER[app]), (app, point)
            assert not any(leftovers[name] for name in TABLES if name not in COMMIT_ORDER[app]), (app, point)
        assert kill["summary"] is False, (app, point)  # the summary is written last
        print(f"{app} killed {point}: " + ", ".join(  # the report of `pytest -s`
            f"{name} {'new' if name in committed else 'old'} v{kill['seen'][name]['version']}"
            f"{f' +{len(leftovers[name])} unnamed' if leftovers[name] else ''}" for name in COMMIT_ORDER[app]))
        # the snapshot is _device_state's commit: until it, the snapshot reader (which reads each
        # table at the Delta version the snapshot record names) sees the previous snapshot whole
        done = app == "rebuild" and point == "after_last_commit"
        assert kill["latest"] == (v1 if done else v0), (app, point)
        assert kill["snapshot"] == {t: expected_state(faults.sim, 1 if done else 0)[t]
                                    for t in snapshot_store.PUBLIC_TABLES}, (app, point)


@pytest.mark.parametrize("app", list(KILL_POINTS))
def test_rerun_after_each_kill_equals_an_uninterrupted_run(faults, app):
    """The next run on the killed run's root gives every table the rows of the uninterrupted run."""
    b = faults.chain
    new_root = {"decode": b[1], "dedupe": b[2], "rebuild": b[3]}[app]
    new = observe_reference(new_root)
    iid = faults.intervals[1][0]
    for point, *_ in KILL_POINTS[app]:
        root = faults.state["kills"][(app, point)]["root"]
        after = observe(root)
        for name in TABLES:
            assert after[name]["rows"] == new[name]["rows"], (app, point, name)
            assert set(after[name]["files"]) <= set(after[name]["disk"]), (app, point, name)
        summary = json.loads(summary_file(root, app, iid).read_text())
        assert summary["interval_id"] == iid
        if app == "rebuild":
            latest = snapshot_store.latest(Layout.of(str(root)))
            assert (latest["version"], latest["parent"]) == tuple(
                snapshot_store.version_id(end) for _, _, end in faults.intervals[::-1]), point
            for table in snapshot_store.PUBLIC_TABLES:
                assert snapshot_store.read_snapshot(str(root), table).to_pylist() == \
                    expected_state(faults.sim, 1)[table], (point, table)


# ---------------------------------------------------------------------------------------------
# the uninterrupted runs equal the ground truth
# ---------------------------------------------------------------------------------------------
def test_decode_equals_the_staged_rows(faults):
    for iid, _, _ in faults.intervals:
        events, quarantine = decoded_keys(faults.root, iid)
        want_events, want_quarantine = expected_decode(faults.root, iid)
        assert events == want_events, iid
        assert quarantine == want_quarantine, iid
        seqs = [k[0] for k in events] + [k[0] for k in quarantine]
        assert sorted(seqs) == sorted(staged_table(faults.root, iid).column("stream_seq").to_pylist())
        assert len(seqs) == len(set(seqs))  # no row lost, no row doubled
        summary = json.loads(summary_file(faults.root, "decode", iid).read_text())
        assert summary["fetched"] == summary["decoded"] + summary["quarantined"] == len(seqs)
    assert sum(len(decoded_keys(faults.root, i)[1]) for i, _, _ in faults.intervals) == CONFIG.corrupt


def test_dedupe_one_row_per_message_id(faults):
    sim = faults.sim
    all_ids = []
    for k, (iid, _, _) in enumerate(faults.intervals):
        ids = sorted(r["msg_id"] for r in read_delta(faults.root / "events_deduped", iid))
        earlier = {m.msg_id for m in sim.messages if m.interval < k and m.msg_id}
        want = sorted({m.msg_id for m in sim.messages if m.interval == k and m.msg_id} - earlier)
        assert ids == want, k
        # the index holds every distinct ID the interval had (the next intervals' lookback)
        assert sorted(r["msg_id"] for r in read_delta(faults.root / "msgid_index", iid)) == sorted(
            {m.msg_id for m in sim.messages if m.interval == k and m.msg_id}), k
        all_ids += ids
    # every message ID exactly once over all intervals, although the publisher duplicated some
    # messages within and across interval boundaries
    assert sorted(all_ids) == sorted({m.msg_id for m in sim.messages if m.msg_id})
    dups = [m for m in sim.messages if m.fault == "duplicate"]
    assert dups and any(m.interval > min(n.interval for n in sim.messages if n.msg_id == m.msg_id) for m in dups)


def test_snapshots_equal_ground_truth(faults):
    latest = snapshot_store.latest(Layout.of(str(faults.root)))
    assert latest["version"] == snapshot_store.version_id(faults.intervals[-1][2])
    assert latest["parent"] == snapshot_store.version_id(faults.intervals[0][2])
    for k, (iid, _, end_ns) in enumerate(faults.intervals):
        version = snapshot_store.version_id(end_ns)
        assert snapshot_store.snapshot(Layout.of(str(faults.root)), version)["interval_id"] == iid
        expected = expected_state(faults.sim, k)
        for table in snapshot_store.PUBLIC_TABLES:
            got = snapshot_store.read_snapshot(str(faults.root), table, version).to_pylist()
            assert got == expected[table], (k, table)
            assert got, (k, table)


# ---------------------------------------------------------------------------------------------
# fuzzed payloads through the decode application
# ---------------------------------------------------------------------------------------------
def test_fuzzed_batch_through_the_decode_app_reconciles(faults):
    summary = next(r["ok"] for r in faults.state["last"] if r.get("ok", {}).get("interval_id") == FUZZ_IID)
    n = 400
    assert summary["interval_id"] == FUZZ_IID
    assert summary["fetched"] == n == summary["decoded"] + summary["quarantined"]
    assert summary["quarantined"] > 100 and summary["decoded"] > 50, summary
    assert set(summary["per_reason"]) <= DECODE_ERROR_REASONS
    events, quarantine = decoded_keys(faults.fuzz_root, FUZZ_IID)
    want_events, want_quarantine = expected_decode(faults.fuzz_root, FUZZ_IID)
    assert events == want_events and quarantine == want_quarantine
    assert sorted(k[0] for k in events + quarantine) == list(range(1, n + 1))
    rows = read_delta(faults.fuzz_root / "quarantine", FUZZ_IID)
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
    dedupes = [r["ok"] for r in faults.state["last"]
               if r.get("ok", {}).get("app") == "dedupe" and r["ok"]["interval_id"] in faults.durable_ids]
    ids = []
    for iid in faults.durable_ids:
        ids += [r["msg_id"] for r in read_delta(faults.durable_root / "events_deduped", iid)]
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
    """Whatever happened to each run, the committed tables are complete and correct, and hold the
    files of one run only."""
    i0 = faults.intervals[0][0]
    assert decoded_keys(faults.conc_root, i0) == expected_decode(faults.chain[0], i0)
    for name in ("events", "quarantine"):
        seen = table_state(faults.conc_root, name)
        assert set(seen["files"]) <= set(seen["disk"]), name  # no named file missing
        write_ids = {f.rsplit("-", 1)[-1] for f in seen["files"]}
        assert len(write_ids) == 1, (name, seen["files"])  # not a mix of the two runs' files
    assert table_state(faults.conc_root, "events")["rows"] == [
        r for r in table_state(faults.chain[0], "events")["rows"] if json.loads(r)["interval_id"] == i0]


def test_concurrent_second_run_is_refused_clearly_or_both_succeed(faults):
    """Each run either succeeded or failed with an error that says another run committed the interval."""
    outcomes = [faults.state["conc_a"], faults.state["conc_b"]]
    for name, out in zip(("A", "B"), outcomes, strict=True):
        assert out, f"run {name} wrote no result (rc {faults.state['conc_rc']})"
        if "error" in out[0]:
            assert out[0]["error"].startswith("TableCommitError: "), f"run {name}: {out[0]['error']}"
            assert "newer run of the same interval committed first" in out[0]["error"] or \
                "another writer committed" in out[0]["error"], f"run {name}: {out[0]['error']}"
