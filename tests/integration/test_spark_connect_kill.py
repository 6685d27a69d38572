"""A Spark Connect client killed in the middle of its commits leaves each table old or new, never a mix.

On Spark Connect the driver logic (planning, the checks, the Delta commits with ``deltalake``) runs
in the client process, the tasks on the server's executors (docs/spark-connect.md). So the client
can die between two Delta transactions, or while the server's tasks still write data files; the
server lives on. This is the Connect half of the classic kill matrix
(``tests/integration/test_faults_spark.py``), with the same mechanism: a small driver script
(:data:`DRIVER`) runs the applications in one client process and, armed at a point, writes a
marker file and SIGKILLs itself. The production code has no hook.

Real parts: the shared Spark Connect server (``spark_connect_server``; its Python workers have no
provider, each client ships it with ``addArtifacts``), one client process per kill
(``SPARK_REMOTE`` set, as ``python spark_apps/<app>.py`` runs), and ``deltalake`` and
``polars.read_delta`` to read the tables (no reader of the project).

**The reference chain** (uninterrupted Connect runs, each root a copy of the one before): ``B0`` =
decode + dedupe + rebuild of interval 0; ``B1`` = ``B0`` + decode of interval 1; ``B2`` = ``B1`` +
dedupe of interval 1; ``B3`` = ``B2`` + rebuild of interval 1.

**The kill points** (:data:`KILL_POINTS`), each on a fresh copy of the root before the app
(``B0``, ``B1``, ``B2``): ``txn<k>``: right before the client's ``k+1``-th Delta transaction
(``deltalake.DeltaTable.create_write_transaction``, the commit itself), so ``txn0`` is after the
data files are written and ``txn1`` between the first and the second table's commit; ``summary``:
after the last commit, before the run summary; ``during_job`` (decode): the server's task kills
the client at its 2nd Parquet write, while the job runs.

After each kill, per table, read with ``deltalake`` and ``polars``: exactly the previous version
(same Delta version, data files and rows as the copy's source) or exactly the new one (the rows of
the reference chain's next root), as far as the commits got; every file the log names is on disk;
the snapshot a reader resolves through ``_device_state``'s commit (the public tables at the Delta
versions it names) is the old snapshot or the new one, whole. Then one client reruns each killed
app on its copy: every table equals the reference chain's next root (no row doubled), and the run
summary is there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from urllib.parse import unquote

import polars as pl
import pytest
from deltalake import DeltaTable

from airflow_provider_plgd.simulator import SimulationConfig, generate
from airflow_provider_plgd.tables import snapshot_store
from plgd_devtools.spark import spark_lock
from tests.integration.staging_data import stage_simulation

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
CONFIG = SimulationConfig(seed=23, owners=2, devices_per_owner=3, resources_per_device=2, intervals=2,
                          steps_per_interval=12, duplicates=0.1, corrupt=2, leadrt="first", unregister=True)
BUCKETS = 4
#: Every table of a root, as folders below it.
TABLES = ("events", "quarantine", "msgid_index", "events_deduped",
          *(f"snapshots/{t}" for t in snapshot_store.ALL_TABLES))
#: The tables each app commits, in its commit order (one Delta transaction each).
COMMIT_ORDER = {
    "decode": ["events", "quarantine"],
    "dedupe": ["msgid_index", "events_deduped"],
    "rebuild": [f"snapshots/{t}" for t in snapshot_store.ALL_TABLES],  # _device_state last
}
#: ``{app: [point]}``; ``txn<k>``: killed before the ``k+1``-th Delta transaction (``k`` tables committed).
KILL_POINTS = {
    "decode": ["during_job", "txn0", "txn1", "summary"],
    "dedupe": ["txn0", "txn1", "summary"],
    "rebuild": ["txn0", "txn1", f"txn{len(snapshot_store.ALL_TABLES) - 1}", "summary"],
}
#: Columns that name the run (its ID, its files), not the content.
RUN_COLUMNS = {"run_id", "write_id"}


def committed_by_kill(app: str, point: str) -> list[str]:
    """The tables that a run of ``app`` killed at ``point`` had committed."""
    order = COMMIT_ORDER[app]
    if point == "summary":
        return order
    return order[:int(point[3:])] if point.startswith("txn") else []


DRIVER = textwrap.dedent('''
    """Runs plgd Spark applications in one Spark Connect client; a step may be armed to SIGKILL
    this client at a chosen point (test_spark_connect_kill.py)."""
    import json, os, shutil, signal, sys
    from deltalake import DeltaTable
    from airflow_provider_plgd.spark import decode_job, dedupe_job, rebuild_job, session
    from airflow_provider_plgd.spark_apps import decode_events, dedupe_events, rebuild_snapshots

    cfg = json.load(open(sys.argv[1]))
    MARKER, CLIENT = cfg["marker"], os.getpid()

    def die(point, pid=CLIENT, marker=MARKER):
        """Write the marker, then SIGKILL the client (called in the client, or in a server task)."""
        import os, signal
        with open(marker + ".tmp", "w") as fh:
            fh.write(point)
        os.rename(marker + ".tmp", marker)
        os.kill(pid, signal.SIGKILL)

    def arm(app, point):
        """Arm ``point`` for one run of ``app``; return the undo."""
        if point.startswith("txn"):
            nth, real, calls = int(point[3:]) + 1, DeltaTable.create_write_transaction, [0]

            def create_write_transaction(self, *args, **kwargs):
                calls[0] += 1
                if calls[0] == nth:
                    die(point)
                return real(self, *args, **kwargs)
            DeltaTable.create_write_transaction = create_write_transaction
            return lambda: setattr(DeltaTable, "create_write_transaction", real)
        if point == "summary":
            module = {"decode": decode_job, "dedupe": dedupe_job, "rebuild": rebuild_job}[app]
            real = module.finish_run

            def finish_run(*args, **kwargs):
                die(point)
            module.finish_run = finish_run
            return lambda: setattr(module, "finish_run", real)
        assert point == "during_job" and app == "decode", point
        real = decode_job.make_rdd_task

        def make_rdd_task(*args, **kwargs):
            task = real(*args, **kwargs)

            def killing_task(iterator):  # runs in the server's Python worker
                import pyarrow.parquet as pq
                write, writes = pq.ParquetWriter.write_table, [0]

                def write_table(self, *a, **k):
                    writes[0] += 1
                    if writes[0] == 2:
                        die(point)
                    return write(self, *a, **k)
                pq.ParquetWriter.write_table = write_table
                try:
                    yield from task(iterator)
                finally:
                    pq.ParquetWriter.write_table = write
            return killing_task
        decode_job.make_rdd_task = make_rdd_task
        return lambda: setattr(decode_job, "make_rdd_task", real)

    apps = {"decode": decode_events, "dedupe": dedupe_events, "rebuild": rebuild_snapshots}
    spark = session.build_spark_session("plgd-test-connect-kill")
    session.ship_code(spark)
    out = []
    for step in cfg["steps"]:
        if "copy" in step:
            shutil.copytree(*step["copy"])
            continue
        undo = arm(step["app"], step["arm"]) if step.get("arm") else None
        app = apps[step["app"]]
        try:
            out.append(app.run(spark, app.parse_args(step["argv"])))
        finally:
            if undo:
                undo()
        json.dump(out, open(cfg["out"], "w"), default=str)
    spark.stop()
''')


# ---------------------------------------------------------------------------------------------
# reading the tables (deltalake, polars)
# ---------------------------------------------------------------------------------------------
def _relative(folder: Path, uri: str) -> str:
    path = uri[len("file://"):] if uri.startswith("file://") else uri
    return str(Path(unquote(path)).relative_to(folder))


def _content(rows: list[dict]) -> list[str]:
    """Rows as sorted canonical JSON, without the columns that name the run."""
    return sorted(json.dumps({k: v for k, v in r.items() if k not in RUN_COLUMNS}, sort_keys=True, default=repr)
                  for r in rows)


def table_state(root: Path, name: str) -> dict:
    """What readers see of table ``name`` under ``root``: Delta ``version``, its ``rows``
    (:func:`_content`), the data ``files`` its log names and the Parquet files on ``disk`` (relative
    to the table), and the rows Polars' ``read_delta`` sees (:func:`_content`)."""
    folder = root / name
    disk = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.parquet")
                  if "_delta_log" not in p.parts) if folder.exists() else []
    if not (folder / "_delta_log").is_dir():
        return {"version": None, "rows": [], "files": [], "disk": disk, "polars": []}
    dt = DeltaTable(str(folder))
    return {"version": dt.version(), "rows": _content(dt.to_pyarrow_table().to_pylist()),
            "files": sorted(_relative(folder, u) for u in dt.file_uris()), "disk": disk,
            "polars": _content(pl.read_delta(str(folder)).to_dicts())}


def observe(root: Path) -> dict[str, dict]:
    return {name: table_state(root, name) for name in TABLES}


def resolved_snapshot(root: Path) -> dict[str, list[str]]:
    """The snapshot as a Delta reader resolves it: ``_device_state``'s newest commit names the
    Delta version of each public table (its ``commitInfo``); those versions' rows (deltalake)."""
    state = root / "snapshots" / snapshot_store.STATE_TABLE
    info = json.loads(DeltaTable(str(state)).history(1)[0]["plgd"])
    return {t: _content(DeltaTable(str(root / "snapshots" / t), version=info["delta_versions"][t])
                        .to_pyarrow_table().to_pylist()) for t in snapshot_store.PUBLIC_TABLES}


def summary_file(root: Path, app: str, iid: str) -> Path:
    return root / "_runs" / app / f"interval={iid}.json"


# ---------------------------------------------------------------------------------------------
# the client processes
# ---------------------------------------------------------------------------------------------
def _argv(app: str, root: Path, interval: tuple) -> list[str]:
    iid, end, _ = interval
    argv = ["--root", str(root), "--interval-id", iid]
    return [*argv, "--snapshot-time", end, "--buckets", str(BUCKETS)] if app == "rebuild" else argv


def _client(base: Path, name: str, remote: str, steps: list[dict], *, killed: bool) -> str | None:
    """One client process running ``steps``; ``killed``: it must die at its armed point (return the
    marker), else succeed."""
    folder = base / name
    folder.mkdir()
    marker, log = folder / "marker", folder / "client.log"
    (folder / "cfg.json").write_text(json.dumps({"steps": steps, "marker": str(marker), "out": str(folder / "out.json")}))
    (folder / "driver.py").write_text(DRIVER)
    env = dict(os.environ, SPARK_REMOTE=remote, PYTHONPATH=str(REPO))
    env.pop("PYSPARK_PYTHON", None)  # the client runs no Python worker
    with log.open("ab") as fh:
        proc = subprocess.Popen([sys.executable, str(folder / "driver.py"), str(folder / "cfg.json")], env=env,
                                stdout=fh, stderr=subprocess.STDOUT, cwd=folder, start_new_session=True)
        try:
            rc = proc.wait(600)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(60)
            pytest.fail(f"{name}: no end in 600 s:\n{log.read_text(errors='replace')[-4000:]}")
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
    if not killed:
        assert rc == 0, f"{name} failed ({rc}):\n{tail}"
        return None
    assert rc == -signal.SIGKILL and marker.exists(), f"{name} not killed at its point ({rc}):\n{tail}"
    return marker.read_text()


@pytest.fixture(scope="module")
def kills(tmp_path_factory, spark_connect_server):
    base = tmp_path_factory.mktemp("connect_kill")
    b0, b1, b2, b3 = chain = [base / f"B{k}" for k in range(4)]
    sim = generate(CONFIG)
    intervals = stage_simulation(b0, sim)
    i0, i1 = intervals
    remote = spark_connect_server.remote
    state: dict = {"kills": {}, "timings": {}}
    with spark_lock():
        t = time.monotonic()
        _client(base, "reference", remote, [
            *({"app": app, "argv": _argv(app, b0, i0)} for app in ("decode", "dedupe", "rebuild")),
            {"copy": [str(b0), str(b1)]}, {"app": "decode", "argv": _argv("decode", b1, i1)},
            {"copy": [str(b1), str(b2)]}, {"app": "dedupe", "argv": _argv("dedupe", b2, i1)},
            {"copy": [str(b2), str(b3)]}, {"app": "rebuild", "argv": _argv("rebuild", b3, i1)}], killed=False)
        state["timings"]["reference"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        source = {"decode": b0, "dedupe": b1, "rebuild": b2}
        reruns = []
        for app, points in KILL_POINTS.items():
            for point in points:
                root = base / f"kill-{app}-{point}"
                marker = _client(base, f"p-{app}-{point}", remote, [
                    {"copy": [str(source[app]), str(root)]},
                    {"app": app, "argv": _argv(app, root, i1), "arm": point}], killed=True)
                if point == "during_job":  # the server's tasks may still write: let the job end or stop
                    time.sleep(3)
                state["kills"][(app, point)] = {
                    "marker": marker, "root": root, "seen": observe(root), "snapshot": resolved_snapshot(root),
                    "summary": summary_file(root, app, i1[0]).exists()}
                reruns.append({"app": app, "argv": _argv(app, root, i1)})
        state["timings"]["kills"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        _client(base, "reruns", remote, reruns, killed=False)
        state["timings"]["reruns"] = round(time.monotonic() - t, 1)
    print("connect kill timings:", state["timings"])
    return {"chain": chain, "intervals": intervals, "state": state}


# ---------------------------------------------------------------------------------------------
# the tests
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("app", list(KILL_POINTS))
def test_a_killed_client_leaves_each_table_old_or_new(kills, app):
    """After the client's SIGKILL at each point, every table is exactly its previous version (same
    Delta version, files and rows) or exactly the new one (the rows of an uninterrupted run), as
    far as the commits got; Polars reads the same rows; the snapshot a reader resolves is whole."""
    b = kills["chain"]
    old_root, new_root = {"decode": (b[0], b[1]), "dedupe": (b[1], b[2]), "rebuild": (b[2], b[3])}[app]
    old, new = observe(old_root), observe(new_root)
    old_snapshot, new_snapshot = resolved_snapshot(old_root), resolved_snapshot(new_root)
    # the rebuild of interval 1 changes the snapshot: the check below tells old from new
    assert (old_snapshot != new_snapshot) == (app == "rebuild")
    for point in KILL_POINTS[app]:
        kill = kills["state"]["kills"][(app, point)]
        assert kill["marker"] == point, (app, point)
        committed = committed_by_kill(app, point)
        for name, seen in kill["seen"].items():
            where = (app, point, name)
            assert set(seen["files"]) <= set(seen["disk"]), where  # every named file is there
            assert seen["polars"] == seen["rows"], where  # Polars reads the same rows
            if name in committed:  # entirely the new version
                assert seen["version"] > old[name]["version"], where
                assert seen["rows"] == new[name]["rows"], where
            else:  # entirely the previous version
                assert (seen["version"], seen["files"]) == (old[name]["version"], old[name]["files"]), where
                assert seen["rows"] == old[name]["rows"], where
        for name in COMMIT_ORDER[app]:  # the two versions differ in rows: "old" and "new" are told apart
            assert old[name]["rows"] != new[name]["rows"], (app, name)
        done = app == "rebuild" and point == "summary"
        assert kill["snapshot"] == (new_snapshot if done else old_snapshot), (app, point)
        assert kill["summary"] is False, (app, point)  # the summary is written last
        print(f"connect {app} killed {point}: " + ", ".join(
            f"{name} {'new' if name in committed else 'old'} v{kill['seen'][name]['version']}"
            for name in COMMIT_ORDER[app]))


@pytest.mark.parametrize("app", list(KILL_POINTS))
def test_the_rerun_after_each_kill_completes_the_interval_once(kills, app):
    """The next client's run on the killed run's root gives every table the rows of the
    uninterrupted run (none doubled) and writes the run summary."""
    b = kills["chain"]
    new = observe({"decode": b[1], "dedupe": b[2], "rebuild": b[3]}[app])
    iid = kills["intervals"][1][0]
    for point in KILL_POINTS[app]:
        root = kills["state"]["kills"][(app, point)]["root"]
        after = observe(root)
        for name in TABLES:
            assert after[name]["rows"] == new[name]["rows"], (app, point, name)
            assert after[name]["polars"] == new[name]["rows"], (app, point, name)
            assert set(after[name]["files"]) <= set(after[name]["disk"]), (app, point, name)
        assert len(set(after["events"]["rows"])) == len(after["events"]["rows"]), (app, point)  # no row twice
        assert json.loads(summary_file(root, app, iid).read_text())["interval_id"] == iid
        if app == "rebuild":
            assert resolved_snapshot(root) == resolved_snapshot(b[3]), point
