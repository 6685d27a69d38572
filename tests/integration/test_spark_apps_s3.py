"""decode -> dedupe -> rebuild on an ``s3://`` root: a real S3 API, no Hadoop cloud connector.

moto's standalone S3 server (``ThreadedMotoServer`` on 127.0.0.1) holds the bucket. Simulated
plgd traffic of two intervals is staged there with the provider's staging writer through fsspec
(``s3fs``), as the fetch operator does. One ``spark-submit --master local[2]`` (pip's pyspark: no
``hadoop-aws`` jar) runs the three applications, in one JVM, for each interval on
``s3://plgd-test/root``; ``AWS_ENDPOINT_URL`` and dummy credentials come from the environment
(s3fs reads them itself, on the driver and in the Python workers). On the way, the first decode
of interval 1 is made to fail after its data files are written and before its manifest: nothing
of it is visible, and the rerun commits cleanly.

Asserted: the decode counts reconcile with what was staged; ``events_deduped`` holds one row per
message ID; the snapshot tables read back from the bucket (``snapshot_store.read_snapshot``)
equal the simulator's ground truth; every committed folder holds exactly the files its manifest
names. Spark runs under ``/tmp/spark.lock``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from plgd_devtools.spark import spark_lock, spark_submit_env
from tests.integration.staging_data import stage_simulation

from airflow_provider_plgd import staging
from airflow_provider_plgd.simulator import SimulationConfig, expected_state, generate

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
BUCKET = "plgd-test"
ROOT = f"s3://{BUCKET}/root"
CONFIG = SimulationConfig(seed=23, owners=2, devices_per_owner=3, resources_per_device=2, intervals=2,
                          steps_per_interval=20, duplicates=0.1, corrupt=2, leadrt="first", unregister=True)
#: Dummy credentials for moto (it accepts any); the endpoint is set per test run.
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}

DRIVER = textwrap.dedent('''
    """decode -> dedupe -> rebuild on an s3:// root in one JVM (test_spark_apps_s3.py)."""
    import json, sys
    from airflow_provider_plgd import storage
    from airflow_provider_plgd.spark import folders, session
    from airflow_provider_plgd.spark_apps import decode_events, dedupe_events, rebuild_snapshots

    cfg = json.load(open(sys.argv[1]))
    root = cfg["root"]
    spark = session.build_spark_session("plgd-test-s3")
    out = {"decode": [], "dedupe": [], "rebuild": []}
    for k, (iid, end) in enumerate(cfg["intervals"]):
        decode_args = decode_events.parse_args(["--staging-root", root, "--interval-id", iid, "--output-root", root])
        if k == 1:  # killed between its data files and its manifest (a failure at the commit)
            real = folders.commit_folder
            def failing(folder, files, **kwargs):
                raise OSError("injected failure before the commit of " + folder)
            folders.commit_folder = failing
            try:
                decode_events.run(spark, decode_args)
            except OSError as exc:
                out["failed_decode"] = str(exc)
            finally:
                folders.commit_folder = real
            folder = root + "/events/interval=" + iid
            fs, path = storage.to_fs(folder)
            fs.invalidate_cache()
            out["after_failure"] = {"manifest": folders.read_manifest(folder),
                                    "files": len([p for p in fs.find(path) if p.endswith(".parquet")])}
        out["decode"].append(decode_events.run(spark, decode_args))
        out["dedupe"].append(dedupe_events.run(spark, dedupe_events.parse_args(
            ["--root", root, "--interval-id", iid])))
        out["rebuild"].append(rebuild_snapshots.run(spark, rebuild_snapshots.parse_args(
            ["--root", root, "--interval-id", iid, "--snapshot-time", end, "--buckets", "4"])))
    spark.stop()
    json.dump(out, open(cfg["out"], "w"), default=str)
''')


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto S3 server on 127.0.0.1 with an empty bucket; the AWS_* variables point at it while
    the module's tests run (this process and the spark-submit child)."""
    import boto3
    import fsspec
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {**AWS_ENV, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    fsspec.filesystem("s3").clear_instance_cache()
    try:
        boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env["AWS_DEFAULT_REGION"],
                     aws_access_key_id="testing", aws_secret_access_key="testing").create_bucket(Bucket=BUCKET)
        yield env
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        fsspec.filesystem("s3").clear_instance_cache()
        server.stop()


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
    cmd = [spark_submit_bin, "--master", "local[2]", "--py-files", py_files, "--conf", "spark.ui.enabled=false",
           "--conf", "spark.sql.session.timeZone=UTC", "--driver-memory", "1g",
           str(base / "driver.py"), str(base / "cfg.json")]
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
        staged = sum(int(m["count"]) for m in staging.list_committed(ROOT, "EVENTS", interval_id=iid))
        published = sum(1 for m in pipeline.sim.messages if m.interval == k)
        assert summary["fetched"] == staged == published == summary["decoded"] + summary["quarantined"]
        assert summary["events_path"] == f"{ROOT}/events/interval={iid}"
    assert sum(s["quarantined"] for s in pipeline.out["decode"]) == CONFIG.corrupt


def test_a_failed_commit_leaves_nothing_visible_on_s3(pipeline):
    assert pipeline.out["failed_decode"].startswith("injected failure before the commit of")
    after = pipeline.out["after_failure"]
    assert after["manifest"] is None and after["files"] > 0  # written, but named by no manifest


def test_every_committed_folder_holds_exactly_its_manifest_files(pipeline):
    from airflow_provider_plgd import storage
    from airflow_provider_plgd.spark import folders

    for iid, _, _ in pipeline.intervals:
        for table in ("events", "quarantine", "events_deduped", "msgid_index"):
            folder = f"{ROOT}/{table}/interval={iid}"
            manifest = folders.read_manifest(folder)
            assert manifest is not None and manifest["interval_id"] == iid, folder
            fs, path = storage.to_fs(folder)
            fs.invalidate_cache()
            listed = sorted(p[len(path) + 1:] for p in fs.find(path) if p.endswith(".parquet"))
            assert listed == sorted(f["path"] for f in manifest["files"]), folder
            assert manifest["rows"] == sum(f["rows"] for f in manifest["files"])


def test_deduplicated_events_one_row_per_message_id(pipeline):
    import pyarrow.parquet as pq

    from airflow_provider_plgd import storage
    from airflow_provider_plgd.spark import folders

    sim = pipeline.sim
    all_ids = []
    for k, (iid, _, _) in enumerate(pipeline.intervals):
        folder = f"{ROOT}/events_deduped/interval={iid}"
        fs, path = storage.to_fs(folder)
        ids = []
        for rel, _, _ in folders.folder_files(folder):
            with fs.open(f"{path}/{rel}", "rb") as fh:
                ids += pq.read_table(fh, columns=["msg_id"]).column("msg_id").to_pylist()
        earlier = {m.msg_id for m in sim.messages if m.interval < k and m.msg_id}
        assert sorted(ids) == sorted({m.msg_id for m in sim.messages if m.interval == k and m.msg_id} - earlier), k
        assert pipeline.out["dedupe"][k]["output"] == len(ids)
        all_ids += ids
    assert sorted(all_ids) == sorted({m.msg_id for m in sim.messages if m.msg_id})
    assert sum(d["within_batch_duplicates"] + d["cross_batch_duplicates"] for d in pipeline.out["dedupe"]) == \
        sum(1 for m in sim.messages if m.fault == "duplicate") > 0


def test_snapshots_read_from_the_bucket_equal_the_ground_truth(pipeline):
    from airflow_provider_plgd.spark import snapshot_store

    for k, (iid, _, end_ns) in enumerate(pipeline.intervals):
        version = snapshot_store.version_id(end_ns)
        expected = expected_state(pipeline.sim, k)
        for table in snapshot_store.PUBLIC_TABLES:
            got = snapshot_store.read_snapshot(ROOT, table, version).to_pylist()
            assert got == expected[table], (k, table)
            assert got, (k, table)
    last = expected_state(pipeline.sim, len(pipeline.intervals) - 1)
    for table in snapshot_store.PUBLIC_TABLES:
        assert snapshot_store.read_snapshot(ROOT, table).to_pylist() == last[table]
    assert pipeline.out["rebuild"][-1]["parent"] == snapshot_store.version_id(pipeline.intervals[0][2])
