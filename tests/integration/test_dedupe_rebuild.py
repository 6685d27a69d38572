"""dedupe_events + rebuild_snapshots on a Spark Connect server, and the rebuild's ``spark-submit`` CLI.

Simulated plgd traffic (duplicates within and across intervals, corrupt payloads, a device
unregistered and re-created, version gaps, old-hub snapshots, lead resource types) is staged per
interval with the staging writer (the fetch operator's format), then one client of the session's
Spark Connect server (``spark_connect_server``; the point here is the applications' logic, not the
way Spark starts) runs, in one session, decode -> dedupe -> rebuild for every interval, a rebuild
of everything at once into a second snapshot root (different bucket count), and a rebuild whose
commit is made to fail. The last interval's dedupe is rerun in the same session; then a real
``spark-submit --master local[2]`` calls the rebuild application's command line directly (a rerun
of the last interval: the rebuild CLI's ``spark-submit`` proof, docs/testing.md). Every snapshot version is
compared with the simulator's ``expected_state``; dedupe output with the simulator's message IDs
(also for an interval whose files are staged twice).

Spark jobs hold a Spark slot (``spark_lock``; shared 2-core machine).
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from airflow_provider_plgd.simulator import SimulationConfig, expected_state, generate
from airflow_provider_plgd.spark_deps import spark_app_path
from airflow_provider_plgd.tables import snapshot_store
from airflow_provider_plgd.tables.layout import Layout
from plgd_devtools.spark import FAST_LOCAL_SPARK_CONF, spark_lock, spark_submit_env
from tests.integration.conftest import run_connect_client
from tests.integration.delta_read import delta_rows, delta_table, read_both
from tests.integration.staging_data import stage_simulation

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
CONFIG = SimulationConfig(
    seed=11,
    owners=3,
    devices_per_owner=6,
    resources_per_device=3,
    intervals=4,
    steps_per_interval=30,
    duplicates=0.08,
    corrupt=3,
    old_hub_snapshots=True,
    version_gaps=True,
    unregister=True,
    leadrt="first",
)
BUCKETS = 32

DRIVER = textwrap.dedent('''
    \"\"\"Runs the three apps in one SparkSession (one JVM): see test_dedupe_rebuild.py.\"\"\"
    import json, sys
    from deltalake import DeltaTable
    from airflow_provider_plgd.tables import delta_tables
    from airflow_provider_plgd.tables.layout import Layout
    from airflow_provider_plgd.spark import dedupe_job, session, snapshot_buckets
    from airflow_provider_plgd.tables import snapshot_store
    from airflow_provider_plgd.spark_apps import decode_events, dedupe_events, rebuild_snapshots

    cfg = json.load(open(sys.argv[1]))
    root, root_all = cfg["root"], cfg["root_all"]
    spark = session.build_spark_session("plgd-test-dedupe-rebuild")
    session.ship_code(spark)  # a Spark Connect client: the server's Python workers have no provider
    out = {"decode": [], "dedupe": [], "rebuild": []}
    for iid, end in cfg["intervals"]:
        out["decode"].append(decode_events.run(spark, decode_events.parse_args(
            ["--root", root, "--interval-id", iid])))
        out["dedupe"].append(dedupe_events.run(spark, dedupe_events.parse_args(
            ["--root", root, "--interval-id", iid, "--lookback-intervals", "24"])))
        out["rebuild"].append(rebuild_snapshots.run(spark, rebuild_snapshots.parse_args(
            ["--root", root, "--interval-id", iid, "--snapshot-time", end, "--buckets", str(cfg["buckets"])])))
    last_iid, last_end = cfg["intervals"][-1]
    # a rerun of the last dedupe must give the same rows and counts
    out["dedupe_rerun"] = dedupe_events.run(spark, dedupe_events.parse_args(
        ["--root", root, "--interval-id", last_iid, "--lookback-intervals", "24"]))
    # everything at once, into another snapshot root, with another bucket count
    out["all_at_once"] = rebuild_snapshots.run(spark, rebuild_snapshots.parse_args(
        ["--root", root, "--snapshots-root", root_all, "--interval-id", last_iid,
         "--snapshot-time", str(cfg["last_end_ns"]), "--buckets", "5"]))

    # ---- Spark oracles (test only): the same decisions with Spark's Parquet scan and windows
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from airflow_provider_plgd.spark import fold, schemas

    def log_files(table, intervals):  # the files the Delta log names (deltalake, not our code)
        return DeltaTable(root + "/" + table).file_uris(partition_filters=[("interval_id", "in", list(intervals))])

    def spark_frame(table, iid):  # one interval of a table, read by Spark's Parquet scan
        # (partition columns interval_id and event_type from the Hive paths the log names)
        return (spark.read.schema(schemas.events_spark_schema()).option("basePath", root + "/" + table)
                .parquet(*log_files(table, [iid])))

    # dedupe: a message is (msg_id, content): lowest stream_seq per message (ties: stream, subject),
    # minus the messages of the previous intervals' events; the content by Spark's own xxhash64
    content = F.xxhash64(*schemas.CONTENT_COLUMNS)
    events = spark_frame("events", last_iid).withColumn("_content", content)
    previous = out["dedupe"][-1]["previous_intervals"]
    seen = (spark.read.schema(schemas.events_spark_schema()).option("basePath", root + "/events")
            .parquet(*log_files("events", previous)).select("msg_id", content.alias("_content")).distinct()
            .withColumn("_seen", F.lit(True)))
    order = Window.partitionBy("msg_id", "_content").orderBy(
        F.col("stream_seq").asc_nulls_last(), F.col("stream").asc_nulls_last(), F.col("subject").asc_nulls_last())
    marked = (events.withColumn("_rank", F.when(F.col("msg_id").isNull(), F.lit(1)).otherwise(F.row_number().over(order)))
              .join(seen, ["msg_id", "_content"], "left")
              .withColumn("_class", F.when(F.col("_seen"), F.lit("cross_batch"))
                          .when(F.col("_rank") > 1, F.lit("within_batch")).otherwise(F.lit("kept"))))
    per_type = {}
    for row in marked.groupBy("event_type", "_class").count().collect():
        entry = per_type.setdefault(row["event_type"], {"input": 0, "output": 0, "within_batch": 0, "cross_batch": 0})
        entry["input"] += row["count"]
        entry["output" if row["_class"] == "kept" else row["_class"]] += row["count"]
    out["dedupe_oracle"] = {
        "per_event_type": dict(sorted(per_type.items())),
        "null_msg_id": events.where(F.col("msg_id").isNull()).count(),
        "kept": sorted([r["msg_id"], r["stream_seq"], r["event_type"]] for r in
                       marked.where(F.col("_class") == "kept").select("msg_id", "stream_seq", "event_type").collect()),
        "index": sorted(r["msg_id"] for r in events.where(F.col("msg_id").isNotNull()).select("msg_id").distinct().collect()),
        "index_buckets": {r["msg_id"]: r["b"] for r in events.where(F.col("msg_id").isNotNull()).selectExpr(
            "msg_id", f"cast(pmod(xxhash64(msg_id), {dedupe_job.MSGID_BUCKETS}) as int) as b").distinct().collect()},
    }

    # rebuild: every interval at once as a first snapshot (5 buckets), keyed by Spark SQL's
    # BUCKET_EXPR, repartitioned by bucket, folded by the same executor code (mapInArrow)
    frames = [spark_frame("events_deduped", iid) for iid, _ in cfg["intervals"]]
    events = frames[0]
    for frame in frames[1:]:
        events = events.unionByName(frame)
    events = events.select(*fold.FOLD_INPUT_COLUMNS)
    is_registration = F.col("event_type").isin(fold.DEVICES_REGISTERED, fold.DEVICES_UNREGISTERED)
    events = (events
              .withColumn("_device", F.explode(F.when(is_registration, F.col("device_ids"))
                                               .otherwise(F.array(F.coalesce("device_id", "group_id")))))
              .where(F.col("_device").isNotNull())
              .withColumn("_bucket", F.expr(snapshot_buckets.BUCKET_EXPR.format(buckets=5)
                                            .replace("device_id", "_device")).cast("int")))
    table_schemas = {name: snapshot_store.table_schema(name) for name in snapshot_store.ALL_TABLES}
    oracle_kwargs = dict(snapshots=Layout.of(cfg["root_spark"]), run_id="oracle", old_files_by_bucket={},
                         table_schemas=table_schemas, snapshot_time_ns=cfg["last_end_ns"])
    results = (events.repartition(5, "_bucket")
               .mapInArrow(lambda batches: snapshot_buckets.rebuild_partition(batches, **oracle_kwargs),
                           schemas.to_spark_schema(snapshot_buckets.BUCKET_RESULT_SCHEMA))
               .collect())
    stats = {}
    for r in results:
        if r["table"] == "_stats":
            for key, value in json.loads(r["stats_json"] or "{}").items():
                stats[key] = stats.get(key, 0) + value
    out["rebuild_oracle"] = {
        "events": sum(r["events"] or 0 for r in results if r["table"] == "_stats"),
        "fold": {k: v for k, v in sorted(stats.items()) if v},
        "tables": {t: [r["file"] for r in results if r["table"] == t and r["file"] is not None]
                   for t in snapshot_store.ALL_TABLES},
    }

    # the Python bucket function (xxhash wheel) against Spark SQL's BUCKET_EXPR
    import random, string
    rng = random.Random(5)
    values = cfg["device_ids"] + ["".join(rng.choice(string.ascii_letters + "-é€😀") for _ in range(rng.randint(0, 90)))
                                  for _ in range(2000)]
    frame = spark.createDataFrame([(v,) for v in values], "device_id string").select(
        "device_id", F.xxhash64("device_id").alias("h"),
        F.expr(snapshot_buckets.BUCKET_EXPR.format(buckets=32)).alias("b"))
    out["xxhash_mismatches"] = [r["device_id"] for r in frame.collect()
                                if r["h"] != snapshot_buckets.spark_xxhash64(r["device_id"])
                                or r["b"] != snapshot_buckets.device_bucket(r["device_id"], 32)]
    out["xxhash_checked"] = len(values)
    # a rerun of the last rebuild whose last commit (_device_state, the snapshot's) fails: the
    # previous snapshot stays the latest
    real = delta_tables.commit_files
    def failing(uri, *args, **kwargs):
        if uri.endswith("/snapshots/_device_state"):
            raise OSError("injected failure before the snapshot's commit")
        return real(uri, *args, **kwargs)
    delta_tables.commit_files = failing
    try:
        rebuild_snapshots.run(spark, rebuild_snapshots.parse_args(
            ["--root", root, "--interval-id", last_iid, "--snapshot-time", last_end]))
        out["failure"] = "no exception"
    except OSError as exc:
        out["failure"] = str(exc)
    finally:
        delta_tables.commit_files = real
    # every events file of the first interval staged twice (rows identical in msg_id, stream and
    # stream_seq; the copies added to the Delta log in one more commit): dedupe must still keep
    # exactly one row per message ID
    import os, shutil, time
    import pyarrow as pa
    from deltalake.transaction import AddAction
    first_iid = cfg["intervals"][0][0]
    shutil.copytree(root + "/events", cfg["root_dup"] + "/events")
    shutil.copytree(root + "/quarantine", cfg["root_dup"] + "/quarantine")  # decode commits both
    dup = DeltaTable(cfg["root_dup"] + "/events")
    actions = pa.table(dup.get_add_actions(flatten=True))
    adds = []
    for row in actions.to_pylist():
        if row["partition.interval_id"] != first_iid:
            continue
        again = row["path"][:-len(".parquet")] + "-again.parquet"
        shutil.copy(cfg["root_dup"] + "/events/" + row["path"], cfg["root_dup"] + "/events/" + again)
        adds.append(AddAction(again, row["size_bytes"], {"interval_id": row["partition.interval_id"],
                    "event_type": row["partition.event_type"]}, int(time.time() * 1000), True,
                    json.dumps({"numRecords": row["num_records"]})))
    dup.create_write_transaction(adds, mode="append", schema=dup.schema(), partition_by=["interval_id", "event_type"])
    out["dedupe_dup"] = dedupe_events.run(spark, dedupe_events.parse_args(
        ["--root", cfg["root_dup"], "--interval-id", first_iid]))
    # vacuum on a copy, retention 0: only the latest version's files stay
    shutil.copytree(root + "/snapshots", cfg["root_gc"] + "/snapshots")
    out["vacuum"] = {t: delta_tables.vacuum(snapshot_store.snapshot_table_uri(Layout.of(cfg["root_gc"]), t), 0)
                     for t in snapshot_store.ALL_TABLES}

    # ---- issue 39, on a copy of the tables (root_fix); each step's error is recorded, not raised
    import traceback
    import pyarrow.compute as pc, pyarrow.parquet as pq
    from airflow_provider_plgd.tables import chain, file_records, maintenance
    root_fix, root_fresh = cfg["root_fix"], cfg["root_fresh"]
    ids = [iid for iid, _ in cfg["intervals"]]
    ends = dict(cfg["intervals"])
    shutil.copytree(root, root_fix)
    def attempt(key, fn):
        try:
            out[key] = fn()
        except Exception as exc:
            out[key] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
    def files_of(table, iid):
        return sorted(f.path for f in delta_tables.table_files(root_fix + "/" + table, where={"interval_id": [iid]}))
    def rebuild(r, iid):
        return rebuild_snapshots.run(spark, rebuild_snapshots.parse_args(
            ["--root", r, "--interval-id", iid, "--snapshot-time", ends[iid]]))
    def dedupe(r, iid):
        return dedupe_events.run(spark, dedupe_events.parse_args(
            ["--root", r, "--interval-id", iid, "--lookback-intervals", "24"]))
    arrow_schemas = {"events": schemas.EVENTS_SCHEMA, "quarantine": schemas.QUARANTINE_SCHEMA}
    def rerun_decode(iid, tag, change):
        """A decode rerun of ``iid`` as decode commits it: ``change`` (a pyarrow table -> tables)
        gives each events file's new files; the quarantine files are written again as they are."""
        records = {"events": [], "quarantine": []}
        for table in ("events", "quarantine"):
            for f in delta_tables.table_files(root_fix + "/" + table, where={"interval_id": [iid]}):
                rows = pq.read_table(f.url)
                for n, part in enumerate(change(rows) if table == "events" else [rows]):
                    rel = f.path[:-len(".parquet")] + f"-{tag}{n}.parquet"
                    pq.write_table(part, root_fix + "/" + table + "/" + rel, coerce_timestamps="us")
                    records[table].append(file_records.file_record(
                        rel, rows=part.num_rows, size=os.path.getsize(root_fix + "/" + table + "/" + rel),
                        partition=f.partition))
        rv = int(time.time() * 1000)
        delta_tables.commit_interval("decode", iid, [
            delta_tables.TableCommit(t, root_fix + "/" + t, arrow_schemas[t], records[t],
                                     sum(r["rows"] for r in records[t]))
            for t in ("events", "quarantine")], run_version=rv,
            metadata={"app": "decode", "interval_id": iid, "run_version": rv})
    # A: the same rows in other files compare equal. A rerun of an older interval whose decode
    # wrote its rows into twice as many files (another max_fetch_tasks or cluster size), then a
    # compaction of the passed intervals by table maintenance: each time, the older interval's
    # rebuild finds its events unchanged (content digests), not changed (file sizes)
    rerun_decode(ids[1], "split", lambda t: [t.slice(0, t.num_rows // 2), t.slice(t.num_rows // 2)])
    attempt("fix_dedupe_split", lambda: dedupe(root_fix, ids[1]))
    attempt("fix_unchanged_split", lambda: rebuild(root_fix, ids[1]))
    before = files_of("events_deduped", ids[1])
    out["fix_maintenance"] = maintenance.maintain_tables(root_fix).as_dict()
    out["fix_files"] = {"before": before, "after": files_of("events_deduped", ids[1])}
    attempt("fix_unchanged", lambda: rebuild(root_fix, ids[1]))
    # C + D: a message of an older interval X, whose copy a later interval dropped as seen in X, is
    # deleted from the stream; X is rerun without it (accept_fewer_messages)
    def table_of(table, intervals, columns):
        return DeltaTable(root_fix + "/" + table).to_pyarrow_table(
            partitions=[("interval_id", "in", intervals)], columns=columns)
    for k in range(1, len(ids) - 1):
        later = set(table_of("events", ids[k + 1:], ["msg_id"]).column("msg_id").to_pylist())
        kept = set(table_of("events_deduped", ids[k + 1:], ["msg_id"]).column("msg_id").to_pylist())
        own = set(table_of("events", [ids[k]], ["msg_id"]).column("msg_id").to_pylist())
        candidates = sorted(m for m in (own & later) - kept if m is not None)
        if candidates:
            break
    x, gone = ids[k], candidates[0]
    out["fix_x"], out["fix_gone"] = x, gone
    rerun_decode(x, "purged", lambda t: [t.filter(pc.invert(pc.fill_null(pc.equal(t.column("msg_id"), gone), False)))])
    attempt("fix_dedupe_x", lambda: dedupe(root_fix, x))  # commits; the later intervals become stale
    attempt("fix_stale", lambda: [[s.interval_id, s.because] for s in chain.stale_intervals(Layout.of(root_fix))])
    attempt("fix_refused", lambda: rebuild(root_fix, ids[-1]))  # would fold a stale interval: refused
    attempt("fix_rebuild_x", lambda: rebuild(root_fix, x))  # repaired in place on the snapshot before it
    out["fix_latest_after_repair"] = snapshot_store.latest(Layout.of(root_fix))["interval_id"]
    for iid in ids[ids.index(x) + 1:]:  # the stale intervals, in order (a cleared run or a backfill of each)
        attempt("fix_dedupe_" + iid, lambda: dedupe(root_fix, iid))
        attempt("fix_rebuild_" + iid, lambda: rebuild(root_fix, iid))
    attempt("fix_stale_after", lambda: [s.interval_id for s in chain.stale_intervals(Layout.of(root_fix))])
    # a fresh run over what the stream still holds (the same events and quarantine)
    os.makedirs(root_fresh)
    for table in ("events", "quarantine"):
        shutil.copytree(root_fix + "/" + table, root_fresh + "/" + table)
    for iid in ids:
        dedupe(root_fresh, iid)
    rebuild(root_fresh, ids[-1])  # one snapshot of every interval (equal to one per interval: test_incremental_…)

    spark.stop()
    json.dump(out, open(cfg["out"], "w"), default=str)
''')




def spark_submit(py_files: str, app: str, *args: str, log: Path) -> None:
    """Run ``spark-submit --master local[2]`` (the short-run settings of the tests' DAGs,
    ``FAST_LOCAL_SPARK_CONF``) holding a Spark slot (``spark_lock``, taken before the 20 min
    timeout starts); fail with the log tail."""
    spark_submit_bin = shutil.which("spark-submit", path=str(VENV_BIN)) or "spark-submit"
    conf = {**FAST_LOCAL_SPARK_CONF, "spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC"}
    cmd = [spark_submit_bin, "--master", "local[2]", "--py-files", py_files,
           *(arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")),
           "--driver-memory", "2g", app, *args]
    with spark_lock(), log.open("ab") as fh:
        proc = subprocess.run(cmd, env=spark_submit_env(), stdout=fh, stderr=subprocess.STDOUT, cwd=REPO, timeout=1200)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-60:])
        pytest.fail(f"spark-submit {app} failed ({proc.returncode}):\n{tail}")


def table_rows(root: Path, table: str, delta_version: int | None = None) -> list[dict]:
    """A snapshot table read with ``deltalake`` (at ``delta_version``; default the latest), without
    the partition column ``bucket``, in the contract's column types and sorted by its keys."""
    import pyarrow as pa

    schema = snapshot_store.table_schema(table)
    got = pa.table(delta_table(str(root / "snapshots" / table), delta_version).to_pyarrow_table())
    assert got.column_names[-1] == "bucket"
    got = got.select(schema.names).cast(schema)
    return got.sort_by([(k, "ascending") for k in snapshot_store.sort_keys(table)]).to_pylist()


def snapshot_rows(root: Path, table: str, version: str) -> list[dict]:
    """``table`` of snapshot ``version``: the Delta version its record names."""
    record = snapshot_store.snapshot(Layout.of(str(root)), version)
    assert record is not None, version
    return table_rows(root, table, record["delta_versions"][table] if table != snapshot_store.STATE_TABLE
                      else record["delta_version"])


def deduped_rows(root: Path, iid: str) -> list[dict]:
    rows = read_both(str(root / "events_deduped"), "msg_id", interval_id=iid)
    rows = [{k: r[k] for k in ("msg_id", "stream_seq", "event_type")} for r in rows]
    return sorted(rows, key=lambda r: (r["msg_id"], r["stream_seq"]))


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, spark_connect_server):
    """Stage, then run the driver (one Spark Connect client); returns a namespace of paths and results."""
    from airflow_provider_plgd.spark_deps import build_py_files_zip

    base = tmp_path_factory.mktemp("dedupe_rebuild")
    root, root_all = base / "data", base / "data_all"
    root.mkdir()
    sim = generate(CONFIG)
    intervals = stage_simulation(root, sim)
    py_files = build_py_files_zip(base / "py")
    driver = base / "driver.py"
    driver.write_text(DRIVER)
    cfg = {"root": str(root), "root_all": str(root_all), "root_gc": str(base / "data_gc"),
           "root_dup": str(base / "data_dup"), "root_spark": str(base / "data_spark"), "buckets": BUCKETS, "out": str(base / "out.json"),
           "root_fix": str(base / "data_fix"), "root_fresh": str(base / "data_fresh"),
           "intervals": [[iid, end] for iid, end, _ in intervals], "last_end_ns": intervals[-1][2],
           "device_ids": sorted({m.device_id for m in sim.messages if getattr(m, "device_id", None)})}
    (base / "cfg.json").write_text(json.dumps(cfg))
    log = base / "spark.log"
    with spark_lock():
        run_connect_client(spark_connect_server, driver, str(base / "cfg.json"), log=log, timeout=1200)
    out = json.loads((base / "out.json").read_text())

    class P:
        pass

    p = P()
    p.base, p.root, p.root_all, p.sim, p.intervals, p.out, p.py_files, p.log = (
        base, root, root_all, sim, intervals, out, py_files, log)
    p.root_gc = base / "data_gc"
    p.root_dup = base / "data_dup"
    p.root_spark = base / "data_spark"
    p.root_fix, p.root_fresh = base / "data_fix", base / "data_fresh"
    return p


def test_each_snapshot_equals_expected_state(pipeline):
    for k, (iid, _, end_ns) in enumerate(pipeline.intervals):
        record = snapshot_store.snapshot(Layout.of(str(pipeline.root)), snapshot_store.version_id(end_ns))
        assert record is not None and record["interval_id"] == iid
        expected = expected_state(pipeline.sim, k)
        for table in snapshot_store.PUBLIC_TABLES:
            got = snapshot_rows(pipeline.root, table, record["version"])
            assert got == expected[table], f"interval {k} table {table}"
            assert got, f"interval {k}: table {table} is empty (scenario too small?)"


def test_latest_snapshot_and_final_tables(pipeline):
    """The latest Delta version of each table is the last snapshot, read by deltalake and polars
    (the contract's columns plus ``bucket``), and through ``read_snapshot`` by version and by time."""
    import polars as pl
    import pyarrow as pa

    from airflow_provider_plgd import read_snapshot

    iid, _, end_ns = pipeline.intervals[-1]
    latest = snapshot_store.latest(Layout.of(str(pipeline.root)))
    assert latest["version"] == snapshot_store.version_id(end_ns) and latest["interval_id"] == iid
    expected = expected_state(pipeline.sim, len(pipeline.intervals) - 1)
    for table in snapshot_store.PUBLIC_TABLES:
        assert table_rows(pipeline.root, table) == expected[table]
        frame = pl.read_delta(str(pipeline.root / "snapshots" / table))
        assert frame.columns == [*snapshot_store.table_schema(table).names, "bucket"]
        assert frame.height == len(expected[table]) == latest["rows"][table]
        # columns exactly as docs/data-contracts.md
        assert read_snapshot(str(pipeline.root), table).schema.names == snapshot_store.table_schema(table).names
    # time travel: the snapshot of the first interval by its version and by its time
    _first_iid, _, first_end = pipeline.intervals[0]
    first = expected_state(pipeline.sim, 0)
    from datetime import datetime, timezone
    as_of = datetime.fromtimestamp(first_end / 1e9 + 1, tz=timezone.utc)
    for table in snapshot_store.PUBLIC_TABLES:
        by_version = read_snapshot(str(pipeline.root), table, snapshot_store.version_id(first_end)).to_pylist()
        assert by_version == first[table] == read_snapshot(str(pipeline.root), table, as_of=as_of).to_pylist()
        # and Delta's own time travel (version number), by polars
        record = snapshot_store.snapshot(Layout.of(str(pipeline.root)), snapshot_store.version_id(first_end))
        old = pl.read_delta(str(pipeline.root / "snapshots" / table), version=record["delta_versions"][table])
        assert old.height == len(first[table])
        # ... and by timestamp: the table as of its commit of that snapshot
        # (halfway to the next commit: delta-rs takes a version's time from its log file, written
        # a moment after the commitInfo timestamp)
        dt = delta_table(str(pipeline.root / "snapshots" / table))
        stamps = {h["version"]: h["timestamp"] for h in dt.history()}
        version = record["delta_versions"][table]
        at_ms = (stamps[version] + stamps[version + 1]) / 2
        dt.load_as_version(datetime.fromtimestamp(at_ms / 1000, tz=timezone.utc))
        assert dt.version() == record["delta_versions"][table]
        assert len(pa.table(dt.to_pyarrow_table())) == len(first[table])


def test_incremental_equals_all_at_once(pipeline):
    summary = pipeline.out["all_at_once"]
    assert summary["intervals"] == [iid for iid, _, _ in pipeline.intervals]
    assert summary["parent"] is None and summary["buckets"] == 5
    for table in snapshot_store.PUBLIC_TABLES:
        assert table_rows(pipeline.root_all, table) == table_rows(pipeline.root, table), table


def test_rebuild_equals_the_spark_oracle(pipeline):
    """The rebuild (pyarrow in Python tasks + a Python shuffle by bucket, buckets from the
    ``xxhash`` wheel) and a Spark oracle (Spark's Parquet scan, Spark SQL's bucket expression, a
    ``repartition`` and ``mapInArrow``): the same rows in every table, the internal state too."""
    arrow, oracle = pipeline.out["all_at_once"], pipeline.out["rebuild_oracle"]
    assert oracle["events"] == arrow["events"] > 0 and oracle["fold"] == arrow["fold"]
    import pyarrow as pa
    import pyarrow.parquet as pq

    for table in snapshot_store.ALL_TABLES:
        schema = snapshot_store.table_schema(table)
        files = [pipeline.root_spark / "snapshots" / table / f for f in oracle["tables"][table]]
        got = pa.concat_tables([pq.read_table(f, schema=schema) for f in files]) if files else schema.empty_table()
        got = got.sort_by([(k, "ascending") for k in snapshot_store.sort_keys(table)]).to_pylist()
        assert got == table_rows(pipeline.root_all, table), table


def test_python_bucket_function_equals_spark_sql(pipeline):
    """``snapshot_buckets.device_bucket`` (the ``xxhash`` wheel, used by the rebuild) gives Spark's ``xxhash64`` and
    ``pmod(xxhash64(device_id), 32)`` for every simulated device and 2,000 random strings."""
    assert pipeline.out["xxhash_checked"] > 2000
    assert pipeline.out["xxhash_mismatches"] == []


def test_dedupe_decision_equals_the_spark_oracle(pipeline):
    """The last interval decided by Spark windows (the oracle in the driver) equals the pyarrow
    decision per msg-ID bucket on the executors: same counts, rows and index, and each index file
    holds the IDs of its bucket by Spark SQL's own hash."""
    iid = pipeline.intervals[-1][0]
    driver, oracle = pipeline.out["dedupe"][-1], pipeline.out["dedupe_oracle"]
    for key in ("per_event_type", "null_msg_id"):
        assert oracle[key] == driver[key], key
    assert driver["cross_batch_duplicates"] > 0 and driver["within_batch_duplicates"] > 0
    assert [[r["msg_id"], r["stream_seq"], r["event_type"]] for r in deduped_rows(pipeline.root, iid)] == \
        sorted(oracle["kept"])
    rows = delta_rows(str(pipeline.root / "msgid_index"), interval_id=iid)
    index = [r["msg_id"] for r in rows]
    assert sorted(index) == oracle["index"] == sorted(set(oracle["index"]))
    # one file per msg-ID bucket, each ID in the bucket of Spark's pmod(xxhash64(msg_id), 16)
    buckets = {r["msg_id"]: r["bucket"] for r in rows}
    assert len(set(buckets.values())) > 1
    assert buckets == oracle["index_buckets"]


def test_dedupe_one_row_per_message_id_and_counts(pipeline):
    sim = pipeline.sim
    all_ids: list[str] = []
    cross_total = within_total = 0
    for k, (iid, _, _) in enumerate(pipeline.intervals):
        rows = deduped_rows(pipeline.root, iid)
        ids = [r["msg_id"] for r in rows]
        assert len(ids) == len(set(ids)), f"interval {k}: a msg_id appears twice"
        published = [m for m in sim.messages if m.interval == k and m.msg_id is not None]
        first_seq = {}
        for seq, m in enumerate(sim.messages, start=1):
            if m.interval == k and m.msg_id is not None:
                first_seq.setdefault(m.msg_id, seq)
        earlier = {m.msg_id for m in sim.messages if m.interval < k and m.msg_id is not None}
        expected_ids = sorted(set(first_seq) - earlier)
        assert ids == expected_ids, f"interval {k}"
        # within a batch the lowest stream sequence is kept
        assert all(r["stream_seq"] == first_seq[r["msg_id"]] for r in rows)
        summary = pipeline.out["dedupe"][k]
        cross = sum(1 for m in published if m.msg_id in earlier)
        assert summary["cross_batch_duplicates"] == cross
        assert summary["within_batch_duplicates"] == len(published) - cross - len(expected_ids)
        assert summary["output"] == len(expected_ids)
        # duplicate counts per event type
        cross_by_type = Counter(m.event_type for m in published if m.msg_id in earlier)
        kept_by_type = Counter(r["event_type"] for r in rows)
        within_by_type = Counter(m.event_type for m in published) - cross_by_type - kept_by_type
        per_type = summary["per_event_type"]
        assert {t: v["cross_batch"] for t, v in per_type.items() if v["cross_batch"]} == dict(cross_by_type)
        assert {t: v["within_batch"] for t, v in per_type.items() if v["within_batch"]} == dict(within_by_type)
        assert {t: v["output"] for t, v in per_type.items() if v["output"]} == dict(kept_by_type)
        assert all(v["input"] == v["output"] + v["within_batch"] + v["cross_batch"] for v in per_type.values())
        all_ids += ids
        cross_total += cross
        within_total += summary["within_batch_duplicates"]
    assert len(all_ids) == len(set(all_ids)) == len({m.msg_id for m in sim.messages if m.msg_id})
    n_dups = sum(1 for m in sim.messages if m.fault == "duplicate")
    assert cross_total > 0 and within_total > 0 and cross_total + within_total == n_dups


def test_dedupe_of_exact_copies_falls_back_to_full_rows(pipeline):
    """The same stored message staged twice (equal msg_id, stream, stream_seq) still gives one row."""
    iid = pipeline.intervals[0][0]
    assert deduped_rows(pipeline.root_dup, iid) == deduped_rows(pipeline.root, iid)
    dup, main = pipeline.out["dedupe_dup"], pipeline.out["dedupe"][0]
    assert dup["input"] == 2 * main["input"] and dup["output"] == main["output"]
    assert dup["exact_copies"] is True and main["exact_copies"] is False
    assert dup["within_batch_duplicates"] == main["input"] + main["within_batch_duplicates"]


def test_copy_on_write_by_bucket(pipeline):
    """Each later snapshot's commit replaces only the touched buckets' files; the parent's files of
    every other bucket stay in the table (the Delta log's add actions, read with deltalake)."""
    import pyarrow as pa

    reb = pipeline.out["rebuild"]
    assert reb[0]["parent"] is None and all(r["parent"] == p["version"] for p, r in itertools.pairwise(reb))
    assert all(r["buckets"] == BUCKETS for r in reb)
    carried_total = 0

    def files(table, version):
        actions = pa.table(delta_table(str(pipeline.root / "snapshots" / table), version).get_add_actions(flatten=True))
        found = {}
        for path, bucket in zip(actions.column("path").to_pylist(), actions.column("partition.bucket").to_pylist(),
                                strict=True):
            found.setdefault(int(bucket), []).append(path)
        return found

    for (_, _, prev_end), (_, _, end_ns) in itertools.pairwise(pipeline.intervals):
        parent = snapshot_store.snapshot(Layout.of(str(pipeline.root)), snapshot_store.version_id(prev_end))
        record = snapshot_store.snapshot(Layout.of(str(pipeline.root)), snapshot_store.version_id(end_ns))
        touched = set(record["touched_buckets"])
        for table in snapshot_store.PUBLIC_TABLES:
            before = files(table, parent["delta_versions"][table])
            after = files(table, record["delta_versions"][table])
            for bucket, paths in after.items():
                if bucket in touched:
                    assert all(p.endswith(f"part-{record['run_id']}.parquet") for p in paths), (table, bucket)
                else:  # carried over: exactly the parent's files
                    assert paths == before[bucket], (table, bucket)
                    carried_total += 1
            assert all(b in after for b in before if b not in touched)  # an untouched bucket is never dropped
        assert record["rows"]["resources"] == len(snapshot_rows(pipeline.root, "resources", record["version"]))
    assert carried_total > 0, [r["touched_buckets"] for r in reb]


def test_vacuum_keeps_the_latest_snapshot(pipeline):
    """``delta_tables.vacuum`` with retention 0 on a copy: the files older versions alone named are
    deleted, the latest snapshot reads the same."""
    assert sum(pipeline.out["vacuum"].values()) > 0, pipeline.out["vacuum"]
    for table in snapshot_store.PUBLIC_TABLES:
        assert table_rows(pipeline.root_gc, table) == table_rows(pipeline.root, table)
        on_disk = {p.relative_to(pipeline.root_gc / "snapshots" / table).as_posix()
                   for p in (pipeline.root_gc / "snapshots" / table).rglob("*.parquet")}
        import pyarrow as pa

        named = set(pa.table(delta_table(str(pipeline.root_gc / "snapshots" / table)).get_add_actions(flatten=True))
                    .column("path").to_pylist())
        assert on_disk == named, table


def test_failed_commit_keeps_previous_snapshot(pipeline):
    assert pipeline.out["failure"] == "injected failure before the snapshot's commit"
    _iid, _, end_ns = pipeline.intervals[-1]
    latest = snapshot_store.latest(Layout.of(str(pipeline.root)))
    assert latest["version"] == snapshot_store.version_id(end_ns)
    assert latest["run_id"] == pipeline.out["rebuild"][-1]["run_id"]
    expected = expected_state(pipeline.sim, len(pipeline.intervals) - 1)
    for table in snapshot_store.PUBLIC_TABLES:
        assert snapshot_rows(pipeline.root, table, latest["version"]) == expected[table]


def test_dedupe_rerun_gives_identical_output(pipeline):
    """The driver reran the last interval's dedupe right after the loop: same counts and
    lookback; the rows left in place (the rerun's) are checked against the simulator in
    ``test_dedupe_one_row_per_message_id_and_counts``."""
    first, rerun = pipeline.out["dedupe"][-1], pipeline.out["dedupe_rerun"]
    for key in ("input", "output", "within_batch_duplicates", "cross_batch_duplicates", "per_event_type",
                "previous_intervals", "events_deduped_path"):
        assert rerun[key] == first[key], key


def test_cli_rerun_gives_identical_output(pipeline):
    """spark-submit of the rebuild application itself (``main`` = ``session.run_app``, shared by the
    three apps): rerunning the last interval gives the same snapshot tables."""
    iid, _end_iso, end_ns = pipeline.intervals[-1]
    before_tables = {t: table_rows(pipeline.root, t) for t in snapshot_store.PUBLIC_TABLES}
    spark_submit(pipeline.py_files, spark_app_path("rebuild_snapshots"),
                 "--root", str(pipeline.root), "--interval-id", iid, "--snapshot-time", str(end_ns),
                 log=pipeline.log)
    rebuild = json.loads((pipeline.root / "_runs" / "rebuild" / f"interval={iid}.json").read_text())
    assert rebuild["version"] == snapshot_store.version_id(end_ns)
    assert rebuild["parent"] == snapshot_store.version_id(pipeline.intervals[-2][2])
    assert rebuild["run_id"] != pipeline.out["rebuild"][-1]["run_id"]
    for table in snapshot_store.PUBLIC_TABLES:
        assert table_rows(pipeline.root, table) == before_tables[table], table


def test_maintenance_of_the_spark_tables_keeps_every_row(pipeline, tmp_path):
    """Table maintenance (``maintenance.maintain_tables``) on a copy of the tables the Spark
    applications wrote: the intervals before the latest snapshot's are compacted to one file per
    partition; every table reads the same rows (deltalake), the snapshot tables too."""
    import shutil

    from airflow_provider_plgd.tables import delta_tables, maintenance
    from tests.integration.delta_read import delta_rows

    root = tmp_path / "data"
    shutil.copytree(pipeline.root, root)
    tables = ("events", "quarantine", "events_deduped", "msgid_index")
    canonical = lambda rows: sorted(json.dumps(r, sort_keys=True, default=repr) for r in rows)  # noqa: E731
    before = {t: canonical(delta_rows(str(root / t))) for t in tables if (root / t).exists()}
    snapshots = {t: table_rows(root, t) for t in snapshot_store.PUBLIC_TABLES}
    report = maintenance.maintain_tables(str(root))
    ids = [iid for iid, _, _ in pipeline.intervals]
    assert report.head_interval == ids[-1]
    for t in before:
        assert canonical(delta_rows(str(root / t))) == before[t], t
    files = delta_tables.table_files(str(root / "events_deduped"))
    per_partition: dict[tuple, int] = {}
    for f in files:
        if f.partition["interval_id"] in ids[:-1]:
            key = tuple(sorted(f.partition.items()))
            per_partition[key] = per_partition.get(key, 0) + 1
    assert per_partition and set(per_partition.values()) == {1}
    assert {t: table_rows(root, t) for t in snapshot_store.PUBLIC_TABLES} == snapshots


def test_an_older_intervals_rerun_compares_content_not_files(pipeline):
    """An older interval's rows written again into twice as many files (another fetch split or
    cluster size), and then compacted by table maintenance: each time, a rerun of its rebuild finds
    its events unchanged, compared by the content digest dedupe recorded (and the compaction
    carried), not by files and sizes."""
    out = pipeline.out
    iid = pipeline.intervals[1][0]
    assert out["fix_unchanged_split"].get("unchanged") is True, out["fix_unchanged_split"]
    assert out["fix_dedupe_split"].get("stale_after") == [], out["fix_dedupe_split"]  # the same message IDs
    assert out["fix_maintenance"]["tables"]["events_deduped"]["compacted"]["intervals"] >= 1
    assert len(out["fix_files"]["after"]) < len(out["fix_files"]["before"])
    assert out["fix_unchanged"].get("unchanged") is True, out["fix_unchanged"]
    assert out["fix_unchanged"]["interval_id"] == iid


def test_a_rerun_of_an_older_interval_is_repaired_in_place(pipeline):
    """A message of an older interval X is deleted from the stream after a later interval dropped its
    copy as seen in X; X is rerun without it. Dedupe commits X and names the later intervals stale;
    the head's rebuild refuses to fold them (before any commit); X's rebuild repairs on the snapshot
    before it; rerunning the stale intervals in order brings the message back. Afterwards the tables
    equal a fresh run over the same events (read with deltalake)."""
    out = pipeline.out
    ids = [iid for iid, _, _ in pipeline.intervals]
    x, gone = out["fix_x"], out["fix_gone"]
    after = ids[ids.index(x) + 1:]
    fix, fresh = pipeline.root_fix, pipeline.root_fresh
    deduped = delta_rows(str(fix / "events_deduped"))
    assert [r["interval_id"] for r in deduped if r["msg_id"] == gone] in ([i] for i in after)  # back, once
    canonical = lambda rows: sorted(json.dumps(r, sort_keys=True, default=repr) for r in rows)  # noqa: E731
    assert canonical(deduped) == canonical(delta_rows(str(fresh / "events_deduped")))
    for table in snapshot_store.PUBLIC_TABLES:
        assert table_rows(fix, table) == table_rows(fresh, table), table
    for iid in after:
        assert "error" not in out["fix_rebuild_" + iid], out["fix_rebuild_" + iid]
    assert out["fix_dedupe_x"].get("stale_after") == after, out["fix_dedupe_x"]
    assert [s[0] for s in out["fix_stale"]] == after and {s[1] for s in out["fix_stale"]} == {x}
    assert "stale" in out["fix_refused"]["error"] and ids[-1] in out["fix_refused"]["error"]
    assert out["fix_rebuild_x"].get("unchanged") is None and out["fix_rebuild_x"].get("supersedes"), out["fix_rebuild_x"]
    assert out["fix_latest_after_repair"] == x
    assert out["fix_stale_after"] == []
    assert snapshot_store.latest(Layout.of(str(fix)))["interval_id"] == ids[-1]
