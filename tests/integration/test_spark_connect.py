"""The three applications and the ``plgd-jetstream`` data source on a real Spark Connect server.

Real parts: a Spark Connect server (``spark_connect_server``: one JVM from the installed pyspark,
``local[2]``) whose Python workers run the executor environment (``requirements-executor.txt``,
without the provider: the clients ship it with ``SparkSession.addArtifacts``), nats-server, and
``deltalake``/``polars`` to read the tables.

* The same staging (two intervals of simulator traffic, ``tests/integration/staging_data.py``) is
  processed twice by one driver that runs decode, dedupe and rebuild per interval in one session:
  on classic Spark (``spark-submit``) and on Spark Connect (the same driver as a plain Python
  program, ``SPARK_REMOTE`` set, shipping the provider with ``addArtifacts``). Every table is the
  same, row for row. (Each application's command line on Spark Connect, ``python
  spark_apps/<app>.py``, is what the DAG tests on Connect run: ``test_etl_dag_connect.py`` and
  the others docs/testing.md names.)
* The data source: registered on a Connect session, a bounded read gives the messages the stream
  holds (nats-py ground truth).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_provider_plgd.simulator import SimulationConfig, generate
from airflow_provider_plgd.spark_deps import build_py_files_zip
from airflow_provider_plgd.tables import snapshot_store
from plgd_devtools.spark import FAST_LOCAL_SPARK_CONF, spark_lock, spark_submit_env
from tests.integration.conftest import publish_messages, read_stream, run_connect_client
from tests.integration.delta_read import delta_table
from tests.integration.staging_data import stage_simulation

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
CONFIG = SimulationConfig(seed=7, owners=2, devices_per_owner=3, resources_per_device=2, intervals=2,
                          steps_per_interval=12, duplicates=0.1, corrupt=2, old_hub_snapshots=True,
                          version_gaps=True, unregister=True, leadrt="first")
BUCKETS = 8
INTERVAL_TABLES = ("events", "quarantine", "events_deduped", "msgid_index")

DRIVER = textwrap.dedent('''
    import json, sys
    from airflow_provider_plgd.spark import session
    from airflow_provider_plgd.spark_apps import decode_events, dedupe_events, rebuild_snapshots

    cfg = json.load(open(sys.argv[1]))
    session.setup_logging()
    spark = session.build_spark_session("plgd-test-both-ways")
    session.ship_code(spark)  # Spark Connect: the server's Python workers have no provider
    for iid, end in cfg["intervals"]:
        decode_events.run(spark, decode_events.parse_args(["--root", cfg["root"], "--interval-id", iid]))
        dedupe_events.run(spark, dedupe_events.parse_args(["--root", cfg["root"], "--interval-id", iid]))
        rebuild_snapshots.run(spark, rebuild_snapshots.parse_args(
            ["--root", cfg["root"], "--interval-id", iid, "--snapshot-time", end, "--buckets", str(cfg["buckets"])]))
    spark.stop()
''')


def _rows(uri: Path, version: int | None = None) -> list[dict]:
    """Every row of a Delta table (deltalake), sorted on all columns' reprs."""
    rows = pa.table(delta_table(str(uri), version).to_pyarrow_table()).to_pylist()
    return sorted(rows, key=lambda r: [repr(r[k]) for k in sorted(r)])


def _snapshot_rows(root: Path, table: str) -> list[dict]:
    """The latest snapshot's rows of ``table`` without the columns that name the run."""
    rows = _rows(root / "snapshots" / table)
    drop = {"run_id", "write_id"}
    return [{k: v for k, v in r.items() if k not in drop} for r in rows]


@pytest.fixture(scope="module")
def both_ways(tmp_path_factory, spark_connect_server):
    base = tmp_path_factory.mktemp("connect")
    classic, connect = base / "classic", base / "connect"
    classic.mkdir()
    intervals = stage_simulation(classic, generate(CONFIG))
    shutil.copytree(classic, connect)

    cfg = {"root": str(classic), "buckets": BUCKETS, "intervals": [[iid, end] for iid, end, _ in intervals]}
    (base / "cfg.json").write_text(json.dumps(cfg))
    (base / "driver.py").write_text(DRIVER)
    py_files = build_py_files_zip(base / "py")
    cmd = [shutil.which("spark-submit", path=str(Path(sys.executable).parent)) or "spark-submit",
           "--master", "local[2]", "--py-files", py_files, "--conf", "spark.ui.enabled=false",
           *(arg for key, value in FAST_LOCAL_SPARK_CONF.items() for arg in ("--conf", f"{key}={value}")),
           str(base / "driver.py"), str(base / "cfg.json")]
    with spark_lock(), (base / "classic.log").open("ab") as fh:
        proc = subprocess.run(cmd, env=spark_submit_env(), stdout=fh, stderr=subprocess.STDOUT, cwd=REPO,
                              timeout=900)
    assert proc.returncode == 0, (base / "classic.log").read_text()[-6000:]

    (base / "cfg_connect.json").write_text(json.dumps({**cfg, "root": str(connect)}))
    with spark_lock():
        run_connect_client(spark_connect_server, base / "driver.py", str(base / "cfg_connect.json"),
                           log=base / "connect.log", timeout=600)
    return classic, connect, [iid for iid, _, _ in intervals], base


def test_the_applications_on_connect_write_the_classic_tables(both_ways):
    classic, connect, intervals, base = both_ways
    for table in INTERVAL_TABLES:
        got, want = _rows(connect / table), _rows(classic / table)
        assert got == want, table
        assert {r["interval_id"] for r in want} == set(intervals), table
    assert len(_rows(connect / "events")) > 100 and _rows(connect / "quarantine")
    for table in snapshot_store.ALL_TABLES:
        assert _snapshot_rows(connect, table) == _snapshot_rows(classic, table), table
    assert _snapshot_rows(connect, snapshot_store.STATE_TABLE)
    # the run summaries agree on every count
    for app in ("decode", "dedupe"):
        for iid in intervals:
            a = json.loads((classic / "_runs" / app / f"interval={iid}.json").read_text())
            b = json.loads((connect / "_runs" / app / f"interval={iid}.json").read_text())
            keys = ("fetched", "decoded", "quarantined", "per_event_type", "per_reason") if app == "decode" \
                else ("per_event_type", "input", "output", "duplicates", "null_msg_id")
            assert {k: b.get(k) for k in keys} == {k: a.get(k) for k in keys}, (app, iid)
    assert sum(json.loads((connect / "_runs" / "dedupe" / f"interval={iid}.json").read_text())["duplicates"]
               for iid in intervals) > 0
    # the Connect runs ran as clients of the server (its application, no SparkContext of their own)
    log = (base / "connect.log").read_text()
    assert "shipped" in log and "to the Spark Connect session" in log


def test_the_datasource_on_connect(spark_connect_server, jetstream):
    """``spark.dataSource.register`` on a Connect session: a bounded read gives exactly the stored
    messages of the range (the planning and the reads run in the server's Python workers)."""
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    from airflow_provider_plgd.spark import session as spark_session
    from airflow_provider_plgd.spark.datasource import JetStreamDataSource
    from airflow_provider_plgd.tables.staging import SCHEMA

    subject = "plgd.owners.o1.devices.d1.metadata.devicemetadataupdated"
    seqs = publish_messages(jetstream.url, [(subject, f"m-{i}".encode(), {"Nats-Msg-Id": f"id-{i}"} if i % 3 == 0
                                             else None) for i in range(25)])
    stored = read_stream(jetstream.url)
    with spark_lock():
        spark = RemoteSession.builder.remote(spark_connect_server.remote).create()
        try:
            assert spark_session.ship_code(spark) is not None
            spark.dataSource.register(JetStreamDataSource)
            table = (spark.read.format("plgd-jetstream").option("servers", jetstream.url)
                     .option("start_seq", str(seqs[3])).option("end_seq", str(seqs[20]))
                     .option("max_partition_messages", "5").load().toArrow())
        finally:
            spark.stop()
    assert table.schema.names == SCHEMA.names
    got = sorted(table.to_pylist(), key=lambda r: r["stream_seq"])
    assert [r["stream_seq"] for r in got] == seqs[3:21]
    for r in got:
        subj, _, headers, data = stored[r["stream_seq"]]
        assert (r["subject"], r["data"], r["msg_id"]) == (subj, data, (headers or {}).get("Nats-Msg-Id"))
