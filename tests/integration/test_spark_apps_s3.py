"""decode -> dedupe -> rebuild on an ``s3://`` root: a real S3 API, no Hadoop cloud connector.

moto's standalone S3 server (its own process on 127.0.0.1, ``plgd_devtools.s3_server``) holds the bucket. Simulated
plgd traffic of two intervals is staged there with the provider's staging writer through fsspec
(``s3fs``), as the fetch operator does. One ``spark-submit --master local[2]`` (pip's pyspark: no
``hadoop-aws`` jar) runs the three applications, in one JVM, for each interval on
``s3://plgd-test/root``; ``AWS_ENDPOINT_URL`` and dummy credentials come from the environment
(s3fs reads them itself, on the driver and in the Python workers). On the way, the first decode
of interval 1 is made to fail after its data files are written and before its Delta commit:
nothing of it is visible, and the rerun commits cleanly.

Asserted: the decode counts reconcile with what was staged; ``events_deduped`` holds one row per
message ID; the snapshot tables read back from the bucket (``read_snapshot``, ``deltalake``,
``polars``) equal the simulator's ground truth; every Delta table names only files that exist,
with their row counts. Two writers committing the same interval at once (S3 conditional put, no
lock service): the second is refused, the table holds the first one's rows. Spark runs under
``/tmp/spark.lock``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from airflow_provider_plgd.simulator import SimulationConfig, expected_state, generate
from plgd_devtools.spark import FAST_LOCAL_SPARK_CONF, spark_lock, spark_submit_env
from tests.integration.delta_read import delta_rows, delta_table, options, read_both, staging_rows
from tests.integration.staging_data import stage_simulation

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
BUCKET = "plgd-test"
ROOT = f"s3://{BUCKET}/root"
CONFIG = SimulationConfig(seed=23, owners=2, devices_per_owner=3, resources_per_device=2, intervals=2,
                          steps_per_interval=20, duplicates=0.1, corrupt=2, leadrt="first", unregister=True)

DRIVER = textwrap.dedent('''
    """decode -> dedupe -> rebuild on an s3:// root in one JVM (test_spark_apps_s3.py)."""
    import json, sys
    from airflow_provider_plgd.tables import delta_tables, storage
    from airflow_provider_plgd.spark import session
    from airflow_provider_plgd.spark_apps import decode_events, dedupe_events, rebuild_snapshots

    cfg = json.load(open(sys.argv[1]))
    root = cfg["root"]
    spark = session.build_spark_session("plgd-test-s3")
    out = {"decode": [], "dedupe": [], "rebuild": []}
    for k, (iid, end) in enumerate(cfg["intervals"]):
        decode_args = decode_events.parse_args(["--root", root, "--interval-id", iid])
        if k == 1:  # failed between its data files and its Delta commit
            real = delta_tables.commit_files
            def failing(uri, records, **kwargs):
                raise OSError("injected failure before the commit of " + uri)
            delta_tables.commit_files = failing
            try:
                decode_events.run(spark, decode_args)
            except OSError as exc:
                out["failed_decode"] = str(exc)
            finally:
                delta_tables.commit_files = real
            fs, path = storage.to_fs(root + "/events/interval_id=" + iid)
            fs.invalidate_cache()
            out["after_failure"] = {"files": len([p for p in fs.find(path) if p.endswith(".parquet")])}
        out["decode"].append(decode_events.run(spark, decode_args))
        out["dedupe"].append(dedupe_events.run(spark, dedupe_events.parse_args(
            ["--root", root, "--interval-id", iid])))
        out["rebuild"].append(rebuild_snapshots.run(spark, rebuild_snapshots.parse_args(
            ["--root", root, "--interval-id", iid, "--snapshot-time", end, "--buckets", "4"])))
    spark.stop()
    json.dump(out, open(cfg["out"], "w"), default=str)
''')


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto S3 server (its own process, ``plgd_devtools.s3_server``) with an empty bucket; the
    AWS_* variables point at it while the module's tests run (this process and the spark-submit child)."""
    import fsspec

    from plgd_devtools.s3_server import S3Server

    with S3Server(bucket=BUCKET) as server:
        env = server.env()
        with pytest.MonkeyPatch.context() as patch:  # the module's environment, restored at its end
            for key, value in env.items():
                patch.setenv(key, value)
            fsspec.filesystem("s3").clear_instance_cache()
            try:
                yield env
            finally:
                fsspec.filesystem("s3").clear_instance_cache()


@pytest.fixture(scope="module")
def pipeline(s3, tmp_path_factory):
    from airflow_provider_plgd.spark_deps import build_py_files_zip

    base = tmp_path_factory.mktemp("spark_s3")
    sim = generate(CONFIG)
    intervals = stage_simulation(ROOT, sim)
    py_files = build_py_files_zip(base / "py")
    (base / "driver.py").write_text(DRIVER)
    cfg = {"root": ROOT, "out": str(base / "out.json"), "intervals": [[iid, end] for iid, end, _ in intervals]}
    (base / "cfg.json").write_text(json.dumps(cfg))
    spark_submit_bin = shutil.which("spark-submit", path=str(VENV_BIN)) or "spark-submit"
    # the short-run settings of the Airflow tests' DAGs (C1 JIT, serial GC, no code generation)
    conf = {**FAST_LOCAL_SPARK_CONF, "spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC"}
    cmd = [spark_submit_bin, "--master", "local[2]", "--py-files", py_files,
           *(arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")),
           "--driver-memory", "1g", str(base / "driver.py"), str(base / "cfg.json")]
    log = base / "spark.log"
    with spark_lock(), log.open("ab") as fh:
        proc = subprocess.run(cmd, env=spark_submit_env({**os.environ, **s3}), stdout=fh, stderr=subprocess.STDOUT,
                              cwd=base, timeout=1200)
    if proc.returncode != 0:
        pytest.fail(f"spark-submit failed ({proc.returncode}):\n" + "\n".join(log.read_text().splitlines()[-60:]))

    class P:
        pass

    p = P()
    p.sim, p.intervals, p.out = sim, intervals, json.loads((base / "out.json").read_text())
    return p


def test_decode_counts_reconcile_with_the_staged_messages(pipeline):
    for k, (iid, _, _) in enumerate(pipeline.intervals):
        summary = pipeline.out["decode"][k]
        staged = len(staging_rows(ROOT, interval_id=iid))
        published = sum(1 for m in pipeline.sim.messages if m.interval == k)
        assert summary["fetched"] == staged == published == summary["decoded"] + summary["quarantined"]
        assert summary["events_path"] == f"{ROOT}/events"
        assert len(read_both(f"{ROOT}/events", "stream_seq", interval_id=iid)) == summary["decoded"]
        assert len(read_both(f"{ROOT}/quarantine", "stream_seq", interval_id=iid)) == summary["quarantined"]
    assert sum(s["quarantined"] for s in pipeline.out["decode"]) == CONFIG.corrupt


def test_a_failed_commit_leaves_nothing_visible_on_s3(pipeline):
    """The failed decode wrote data files (still on the bucket), which no Delta commit names: the
    rows of the interval that readers see are exactly the rerun's."""
    assert pipeline.out["failed_decode"].startswith("injected failure before the commit of")
    assert pipeline.out["after_failure"]["files"] > 0
    iid = pipeline.intervals[1][0]
    assert len(delta_rows(f"{ROOT}/events", interval_id=iid)) == pipeline.out["decode"][1]["decoded"]


def test_every_delta_table_names_only_files_that_exist(pipeline):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_provider_plgd.tables import storage

    for table in ("events", "quarantine", "events_deduped", "msgid_index", "snapshots/resources",
                  "snapshots/_device_state"):
        uri = f"{ROOT}/{table}"
        actions = pa.table(delta_table(uri).get_add_actions(flatten=True)).to_pylist()
        assert actions, table
        fs, path = storage.to_fs(uri)
        fs.invalidate_cache()
        for action in actions:
            with fs.open(f"{path}/{action['path']}", "rb") as fh:
                assert pq.ParquetFile(fh).metadata.num_rows == action["num_records"], (table, action["path"])


def test_deduplicated_events_one_row_per_message_id(pipeline):
    sim = pipeline.sim
    all_ids = []
    for k, (iid, _, _) in enumerate(pipeline.intervals):
        ids = [r["msg_id"] for r in read_both(f"{ROOT}/events_deduped", "msg_id", interval_id=iid)]
        earlier = {m.msg_id for m in sim.messages if m.interval < k and m.msg_id}
        assert sorted(ids) == sorted({m.msg_id for m in sim.messages if m.interval == k and m.msg_id} - earlier), k
        assert pipeline.out["dedupe"][k]["output"] == len(ids)
        all_ids += ids
    assert sorted(all_ids) == sorted({m.msg_id for m in sim.messages if m.msg_id})
    assert sum(d["within_batch_duplicates"] + d["cross_batch_duplicates"] for d in pipeline.out["dedupe"]) == \
        sum(1 for m in sim.messages if m.fault == "duplicate") > 0


def test_snapshots_read_from_the_bucket_equal_the_ground_truth(pipeline):
    import polars as pl

    from airflow_provider_plgd import read_snapshot
    from airflow_provider_plgd.tables import snapshot_store

    for k, (_iid, _, end_ns) in enumerate(pipeline.intervals):
        version = snapshot_store.version_id(end_ns)
        expected = expected_state(pipeline.sim, k)
        for table in snapshot_store.PUBLIC_TABLES:
            got = read_snapshot(ROOT, table, version).to_pylist()
            assert got == expected[table], (k, table)
            assert got, (k, table)
    last = expected_state(pipeline.sim, len(pipeline.intervals) - 1)
    for table in snapshot_store.PUBLIC_TABLES:
        assert read_snapshot(ROOT, table).to_pylist() == last[table]
        assert pl.read_delta(f"{ROOT}/snapshots/{table}", storage_options=options(ROOT)).height == len(last[table])
    assert pipeline.out["rebuild"][-1]["parent"] == snapshot_store.version_id(pipeline.intervals[0][2])


def test_two_writers_of_one_interval_at_once_the_second_is_refused(s3, monkeypatch):
    """Two reruns of the same interval commit to one table on the bucket at the same time: both
    loaded the table at the same version; the first commits, the second's commit is refused
    (Delta's conflict check over S3 conditional puts, no lock service) and the table holds exactly
    the first one's rows, never a mix. The one thing faked: the second writer's table is loaded
    before the first commits (``delta_tables.ensure_table`` returns that earlier load)."""
    import pyarrow as pa

    from airflow_provider_plgd.exceptions import TableCommitError
    from airflow_provider_plgd.spark.parquet_io import write_parquet_file
    from airflow_provider_plgd.tables import delta_tables, file_records, storage

    uri = f"s3://{BUCKET}/concurrent/t"
    schema = pa.schema([("msg_id", pa.string()), ("interval_id", pa.string())])

    def files(writer: str, n: int) -> list[dict]:
        fs, base = storage.to_fs(uri)
        rel = f"interval_id=I/part-{writer}.parquet"
        size, meta = write_parquet_file(fs, f"{base}/{rel}", pa.table({"msg_id": [f"{writer}{i}" for i in range(n)]}))
        return [file_records.file_record(rel, rows=n, size=size, partition={"interval_id": "I"},
                                         stats=file_records.parquet_stats(meta))]

    def commit(writer: str, n: int, version: int):
        return delta_tables.commit_files(uri, files(writer, n), schema=schema, partition_by=("interval_id",),
                                         replace=delta_tables.interval_filter("I"), metadata={"writer": writer},
                                         app_id="test/I", run_version=version)

    commit("old", 3, 1)
    stale = delta_tables.ensure_table(uri, schema, ("interval_id",))  # the second writer's load
    commit("a", 4, 2)
    monkeypatch.setattr(delta_tables, "ensure_table", lambda *a, **k: stale)
    with pytest.raises(TableCommitError, match="another writer committed"):
        commit("b", 5, 3)
    rows = read_both(uri, "msg_id", interval_id="I")
    assert sorted(r["msg_id"] for r in rows) == [f"a{i}" for i in range(4)]
