"""decode_events through real ``spark-submit --master local[2]``, then on Spark Connect (two runs, many assertions).

The staging Delta table (written with the fetch's writer and commit, ``tests/integration/staging_data.py``)
holds one interval with:

* simulator traffic (``airflow_provider_plgd.simulator.generate``: lead resource types, old-hub
  snapshots, duplicates, version gaps, unregistrations and corrupt payloads),
* hand-made messages of every event type with every field set (``tests/unit/spark/test_decode_batch``),
* corrupt rows for every quarantine reason, some with NATS headers,
* things that must NOT be read: a file no commit names (a killed fetch's), a stray file in a
  partition folder, and another interval.

Run 1: the app's command line (``spark_apps/decode_events.py``) through ``spark-submit`` with the
``--py-files`` zip of ``spark_deps`` (the decode CLI's ``spark-submit`` proof, docs/testing.md).
Run 2: a small driver, a client of the session's Spark Connect server (``spark_connect_server``),
that reruns the app for the same interval and then reads both tables back with Spark's Parquet
scan of the files the Delta log names (``deltalake``), with ``schemas.events_spark_schema()`` /
``quarantine_spark_schema()`` (Spark's own Delta reader needs the delta-spark jars, which this
machine cannot download). The tables are read with ``deltalake`` and ``polars``
(``tests/integration/delta_read.py``). Spark jobs hold a Spark slot (``spark_lock``; shared 2-core machine).
"""

from __future__ import annotations

import collections
import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_plgd import times
from airflow_provider_plgd.plgd import subjects
from airflow_provider_plgd.plgd.codec import DECODE_ERROR_REASONS
from airflow_provider_plgd.spark import schemas
from airflow_provider_plgd.spark.decode_batch import decode_batch
from airflow_provider_plgd.spark_deps import spark_app_path
from airflow_provider_plgd.tables import staging
from airflow_provider_plgd.tables.layout import Layout
from plgd_devtools.spark import FAST_LOCAL_SPARK_CONF, spark_lock, spark_submit_env
from tests.integration.conftest import run_connect_client
from tests.integration.delta_read import delta_table, read_both, staging_rows
from tests.integration.staging_data import write_batches

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent

STREAM = "EVENTS"
START_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
END_NS = START_NS + 3600 * 1_000_000_000
IID = times.interval_id(START_NS, END_NS)
OTHER_IID = times.interval_id(END_NS, END_NS + 3600 * 1_000_000_000)
HEADER_ID = "hdr-msg-1"


def _unit_cases():
    """Import the every-field cases of the unit tests (tests/ is not a package)."""
    path = REPO / "tests" / "unit" / "spark" / "test_decode_batch.py"
    spec = importlib.util.spec_from_file_location("_decode_batch_cases", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _sim_messages():
    from airflow_provider_plgd.simulator import SimulationConfig, generate

    config = SimulationConfig(
        seed=11, owners=2, devices_per_owner=2, resources_per_device=3, intervals=1, steps_per_interval=60,
        leadrt="first", duplicates=0.05, corrupt=4, old_hub_snapshots=True, version_gaps=True, unregister=True,
    )
    return generate(config).messages




def spark_submit(py_files: str, app: str, *args: str, log: Path) -> None:
    """``spark-submit --master local[2]`` with the short-run settings of the tests' DAGs
    (``FAST_LOCAL_SPARK_CONF``), holding a Spark slot; fails with the log's tail."""
    spark_submit_bin = shutil.which("spark-submit", path=str(VENV_BIN)) or "spark-submit"
    conf = {**FAST_LOCAL_SPARK_CONF, "spark.ui.enabled": "false"}
    cmd = [spark_submit_bin, "--master", "local[2]", "--py-files", py_files,
           *(arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")), app, *args]
    with spark_lock(), open(log, "w") as fh:
        proc = subprocess.run(cmd, env=spark_submit_env(), stdout=fh, stderr=subprocess.STDOUT, cwd=str(log.parent))
    if proc.returncode != 0:
        tail = log.read_text()[-8000:]
        pytest.fail(f"spark-submit {app} failed ({proc.returncode}):\n{tail}")


DRIVER = r'''
import json, sys
import pyarrow.parquet as pq
from deltalake import DeltaTable
from airflow_provider_plgd.spark import schemas, session
from airflow_provider_plgd.spark_apps import decode_events

cfg = json.load(open(sys.argv[1]))
spark = session.build_spark_session("test-decode-rerun")
session.ship_code(spark)  # a Spark Connect client: the server's Python workers have no provider
summary = decode_events.run(spark, decode_events.parse_args(cfg["argv"]))
def frame(root, schema):  # the files the Delta log names; partition columns from their Hive paths
    return spark.read.schema(schema).option("basePath", root).parquet(*DeltaTable(root).file_uris())
events = frame(cfg["events_root"], schemas.events_spark_schema())
quarantine = frame(cfg["quarantine_root"], schemas.quarantine_spark_schema())
pq.write_table(events.toArrow(), cfg["events_out"])
pq.write_table(quarantine.toArrow(), cfg["quarantine_out"])
json.dump({"summary": summary, "events_schema": events.schema.simpleString()}, open(cfg["out"], "w"), default=str)
spark.stop()
'''


def _write_batch(root, owner, event_type, iid, rows, *, commit=True):
    """rows: (seq, subject, time_ns, headers, data), sequences increasing."""
    return write_batches(root, iid, {(owner, event_type): rows}, stream=STREAM, commit=commit)


def read_table(uri: Path) -> list[dict]:
    """The interval's rows of a Delta table, read with deltalake (polars checked to agree)."""
    return sorted(read_both(str(uri), "stream_seq", interval_id=IID), key=lambda r: r["stream_seq"])


def log_files(uri: Path) -> list[str]:
    """The data files the latest Delta version names (relative paths), sorted."""
    return sorted(pa.table(delta_table(str(uri)).get_add_actions(flatten=True)).column("path").to_pylist())


@pytest.fixture(scope="module")
def run(tmp_path_factory, spark_connect_server):
    from airflow_provider_plgd.spark_deps import build_py_files_zip

    base = tmp_path_factory.mktemp("decode_app")
    root = out = base / "data"  # one storage root: staging in, events and quarantine out
    cases = _unit_cases()

    # ---- messages: (subject, data, headers, owner partition, event_type partition, expectation)
    published = []
    for m in _sim_messages():
        published.append((m.subject, m.data, None, m.owner_id, m.event_type, ("sim", m)))
    for event_type, subject, data, cols in cases.all_cases():
        published.append((subject, data, None, cases.OWNER, event_type, ("case", event_type, cols)))
    rc = next(c for c in cases.all_cases() if c[0] == "resourcechanged")
    published.append((rc[1], rc[2], {"Nats-Msg-Id": HEADER_ID, "X-Trace": "t1"}, cases.OWNER,
                      "resourcechanged", ("header",)))
    for reason, row in cases._corrupt_rows():
        headers = {"Nats-Msg-Id": row[2], "X-Extra": "1"} if len(row) > 2 else None
        published.append((row[0], row[1], headers, cases.OWNER, "_corrupt", ("corrupt", reason)))

    seq_of = {}
    groups = collections.defaultdict(list)
    for seq, (subject, data, headers, owner, et, expect) in enumerate(published, start=1):
        seq_of[seq] = (subject, data, headers, expect)
        groups[(owner, et)].append((seq, subject, START_NS + seq * 1_000_000, headers, data))
    for (owner, et), rows in sorted(groups.items()):
        _write_batch(root, owner, et, IID, rows)

    # ---- must not be read
    seq = len(published) + 1000
    _write_batch(root, cases.OWNER, "resourcechanged", OTHER_IID, [(seq, rc[1], END_NS + 5, None, rc[2])])
    # a fetch killed before its commit: its file is on disk, named by no commit
    (uncommitted,) = _write_batch(root, cases.OWNER, "uncommitted", IID,
                                  [(seq + 1, rc[1], START_NS + 7, None, rc[2])], commit=False)
    table = Path(Layout.of(str(root)).staging_table(STREAM))
    assert (table / uncommitted["path"]).exists()
    # a stray file in a committed partition folder
    committed = table / staging.partition_folder(IID, published[0][4])
    stray = pa.table({n: pa.array([v], staging.FILE_SCHEMA.field(n).type) for n, v in zip(
        staging.FILE_SCHEMA.names, [STREAM, seq + 2, rc[1], START_NS // 1000, None, None, rc[2], cases.OWNER],
        strict=True)})
    pq.write_table(stray.cast(staging.FILE_SCHEMA), committed / "part-99999.parquet")

    # ---- run 1: the command line, default reader
    py_files = build_py_files_zip(base / "py")
    assert py_files.endswith(".zip")
    spark_submit(py_files, spark_app_path("decode_events"),
                 "--root", str(root), "--stream", STREAM, "--interval-id", IID,
                 log=base / "run1.log")
    events1 = read_table(out / "events")
    quarantine1 = read_table(out / "quarantine")
    summary1 = json.loads((out / "_runs" / "decode" / f"interval={IID}.json").read_text())
    files1 = {t: log_files(out / t) for t in ("events", "quarantine")}
    versions1 = {t: delta_table(str(out / t)).version() for t in ("events", "quarantine")}

    # ---- run 2: rerun + read back with Spark, as a Spark Connect client
    cfg = {
        "argv": ["--root", str(root), "--interval-id", IID,
                 "--summary-path", str(base / "summary2.json")],
        "events_root": str(out / "events"), "quarantine_root": str(out / "quarantine"),
        "events_out": str(base / "spark_events.parquet"), "quarantine_out": str(base / "spark_quarantine.parquet"),
        "out": str(base / "driver_out.json"),
    }
    (base / "cfg.json").write_text(json.dumps(cfg))
    (base / "driver.py").write_text(DRIVER)
    with spark_lock():
        run_connect_client(spark_connect_server, base / "driver.py", str(base / "cfg.json"), log=base / "run2.log")

    class R:
        pass

    r = R()
    r.base, r.root, r.out, r.cases, r.published, r.seq_of = base, root, out, cases, published, seq_of
    r.events1, r.quarantine1, r.summary1, r.files1, r.versions1 = events1, quarantine1, summary1, files1, versions1
    r.events2 = read_table(out / "events")
    r.quarantine2 = read_table(out / "quarantine")
    r.summary2 = json.loads((base / "summary2.json").read_text())
    r.driver = json.loads((base / "driver_out.json").read_text())
    r.spark_events = sorted(pq.read_table(cfg["events_out"]).to_pylist(), key=lambda x: x["stream_seq"])
    r.spark_quarantine = sorted(pq.read_table(cfg["quarantine_out"]).to_pylist(), key=lambda x: x["stream_seq"])
    r.log1 = (base / "run1.log").read_text()
    return r


def _normalize(row: dict) -> dict:
    """Partition values read back as strings -> the row types of UNION_SCHEMA."""
    out = dict(row)
    if out.get("date") is not None and not isinstance(out["date"], str):
        out["date"] = out["date"].isoformat()
    return out


def test_counts_reconcile(run):
    s = run.summary1
    n = len(run.published)
    assert s["fetched"] == n  # the stray file, the uncommitted folder and the other interval are not counted
    assert s["decoded"] + s["quarantined"] == s["fetched"]
    assert len(run.events1) == s["decoded"] and len(run.quarantine1) == s["quarantined"]
    expected_types = collections.Counter()
    expected_reasons = collections.Counter()
    for _seq, (_, _, _, expect) in run.seq_of.items():
        if expect[0] == "corrupt":
            expected_reasons[expect[1]] += 1
        elif expect[0] == "sim" and expect[1].fault == "corrupt":
            pass
        else:
            et = expect[1].event_type if expect[0] == "sim" else expect[1] if expect[0] == "case" else "resourcechanged"
            expected_types[et] += 1
    assert s["per_event_type"] == dict(sorted(expected_types.items()))
    sim_corrupt = sum(1 for e in run.seq_of.values() if e[3][0] == "sim" and e[3][1].fault == "corrupt")
    assert sim_corrupt == 4
    assert sum(s["per_reason"].values()) == sum(expected_reasons.values()) + sim_corrupt
    for reason, count in expected_reasons.items():
        assert s["per_reason"][reason] >= count
    assert (f"fetched={s['fetched']} read={s['fetched']} decoded={s['decoded']} "
            f"quarantined={s['quarantined']}") in run.log1
    seqs = [r["stream_seq"] for r in run.events1 + run.quarantine1]
    assert sorted(seqs) == list(range(1, n + 1))  # every row exactly once, nothing else


def test_every_field_of_every_event_type(run):
    cases = run.cases
    by_seq = {r["stream_seq"]: _normalize(r) for r in run.events1}
    checked = set()
    for seq, (subject, data, _headers, expect) in run.seq_of.items():
        if expect[0] != "case":
            continue
        event_type, cols = expect[1], expect[2]
        row = by_seq[seq]
        expected = {name: None for name in schemas.EVENTS_COLUMNS}
        expected.update(stream=STREAM, stream_seq=seq, subject=subject, owner_id=cases.OWNER, event_type=event_type,
                        interval_id=IID, date="2026-01-01")
        expected.update(cols)
        if cols.get("aggregate_id"):
            expected["msg_id"] = f"ra:{cols['aggregate_id']}:{cols['version']}:{event_type}:{cols['timestamp']}"
        else:
            expected["msg_id"] = "is:" + hashlib.sha256(subject.encode() + b"\n" + data).hexdigest()
        if "content_data" in cols:
            assert json.loads(row["content_json"]) == {"power": 5, "state": True}
            expected["content_json"] = row["content_json"]
        cases._fix_nested_json(row, expected)
        published_at = row.pop("published_at")
        expected.pop("published_at")
        assert published_at.timestamp() * 1e9 == pytest.approx(START_NS + seq * 1_000_000, abs=1000)
        for name, value in expected.items():
            if name == "published_at":
                continue
            assert row[name] == value, (event_type, name)
        checked.add(event_type)
    from airflow_provider_plgd.plgd.event_types import EVENT_TYPES

    assert checked == set(EVENT_TYPES)


def test_simulated_messages_match_what_was_published(run):
    by_seq = {r["stream_seq"]: r for r in run.events1}
    q_by_seq = {r["stream_seq"]: r for r in run.quarantine1}
    seen_leadrt = seen_snapshot = 0
    for seq, (_subject, _data, _headers, expect) in run.seq_of.items():
        if expect[0] != "sim":
            continue
        m = expect[1]
        if m.fault == "corrupt":
            assert seq in q_by_seq and q_by_seq[seq]["reason"] in DECODE_ERROR_REASONS
            assert q_by_seq[seq]["data"] == m.data
            continue
        row = by_seq[seq]
        parsed = subjects.parse_subject(m.subject)
        assert (row["event_type"], row["owner_id"], row["device_id"]) == (m.event_type, m.owner_id, m.device_id)
        assert row["subject"] == m.subject and row["msg_id"] == m.msg_id
        assert row["aggregate_id"] == m.aggregate_id and row["version"] == m.version
        assert row["timestamp"] == m.timestamp_ns
        assert row["lead_resource_type"] == parsed.lead_resource_type and row["href_id"] == parsed.href_id
        if m.href is not None:
            assert row["href"] == m.href
        seen_leadrt += row["lead_resource_type"] is not None
        seen_snapshot += m.fault == "old_hub_snapshot"
    assert seen_leadrt > 0 and seen_snapshot > 0


def test_spark_output_equals_pure_python_decoder(run):
    """Every column of every row equals decode_batch on the same staging rows (in-process)."""
    rows = staging_rows(run.root, STREAM, interval_id=IID)
    staged = pa.Table.from_pylist([{n: r[n] for n in staging.SCHEMA.names} for r in rows],
                                  schema=staging.SCHEMA).combine_chunks()
    expected = decode_batch(staged.to_batches()[0], IID).to_pylist()
    exp_events = {r["stream_seq"]: r for r in expected if r["reason"] is None}
    exp_q = {r["stream_seq"]: r for r in expected if r["reason"] is not None}
    assert len(exp_events) == len(run.events1) and len(exp_q) == len(run.quarantine1)
    for row in run.events1:
        exp = exp_events[row["stream_seq"]]
        got = _normalize(row)
        for name in schemas.EVENTS_COLUMNS:
            want = exp[name].isoformat() if name == "date" else exp[name]
            assert got[name] == want, (row["stream_seq"], name)
    for row in run.quarantine1:
        exp = exp_q[row["stream_seq"]]
        for name in schemas.QUARANTINE_COLUMNS:
            assert row[name] == exp[name], (row["stream_seq"], name)


def test_quarantine_rows(run):
    q = {r["stream_seq"]: r for r in run.quarantine1}
    for seq, (subject, data, headers, expect) in run.seq_of.items():
        if expect[0] != "corrupt":
            continue
        row = q[seq]
        assert row["reason"] == expect[1], (seq, row["detail"])
        assert row["detail"] and row["stage"] == "decode" and row["interval_id"] == IID
        assert row["subject"] == subject and row["data"] == data and row["stream"] == STREAM
        assert row["published_at"].timestamp() * 1e9 == pytest.approx(START_NS + seq * 1_000_000, abs=1000)
        if headers:
            assert dict(row["headers"]) == headers and row["msg_id"] == headers["Nats-Msg-Id"]
        else:
            assert row["headers"] is None and row["msg_id"] is None
    assert set(q) == {s for s, e in run.seq_of.items() if e[3][0] == "corrupt"
                      or (e[3][0] == "sim" and e[3][1].fault == "corrupt")}


def test_header_msg_id_wins(run):
    seq = next(s for s, e in run.seq_of.items() if e[3][0] == "header")
    row = next(r for r in run.events1 if r["stream_seq"] == seq)
    assert row["msg_id"] == HEADER_ID and row["event_type"] == "resourcechanged"


def test_layout_delta_log_and_timestamps(run):
    """Each table's Delta log names exactly the files of the interval's last run, in
    ``interval_id=../event_type=..`` folders; partition columns are not in the files; timestamps
    are TIMESTAMP_MICROS; the commits carry the interval, the rows and per-file row counts."""
    for table, folders in (("events", 2), ("quarantine", 1)):
        actions = pa.table(delta_table(str(run.out / table)).get_add_actions(flatten=True))
        paths = actions.column("path").to_pylist()
        assert paths and all(p.split("/")[0] == f"interval_id={IID}" and len(p.split("/")) == folders + 1
                             for p in paths)
        assert sum(actions.column("num_records").to_pylist()) == len(getattr(run, f"{table}2"))
        for p in paths:
            names = set(pq.read_schema(run.out / table / p).names)
            assert not {"interval_id"} & names and (table == "quarantine" or "event_type" not in names)
        history = delta_table(str(run.out / table)).history(limit=1)[0]
        meta = json.loads(history["plgd"])
        assert meta["interval_id"] == IID and meta["app"] == "decode"
    assert {p.split("/")[1] for p in run.files1["events"]} == {f"event_type={t}" for t in run.summary1["per_event_type"]}
    part = next((run.out / "events").rglob("*.parquet"))
    meta = pq.ParquetFile(part).metadata.schema
    col = meta.column(meta.names.index("published_at"))
    assert col.physical_type == "INT64" and "timeUnit=microseconds" in str(col.logical_type)  # never INT96


def test_rerun_gives_identical_output(run):
    assert run.events2 == run.events1
    assert run.quarantine2 == run.quarantine1
    for key in ("fetched", "decoded", "quarantined", "per_event_type", "per_reason"):
        assert run.summary2[key] == run.summary1[key]
    # the rerun committed new files in one Delta version per table; run 1's files are no longer
    # named (they stay on disk until a vacuum)
    for table in ("events", "quarantine"):
        files2 = log_files(run.out / table)
        assert len(files2) == len(run.files1[table]) and not set(files2) & set(run.files1[table])
        assert delta_table(str(run.out / table)).version() == run.versions1[table] + 1
        assert run.summary2["delta_versions"][table] == run.versions1[table] + 1


def test_spark_reads_the_files_the_delta_log_names(run):
    assert len(run.spark_events) == len(run.events1)
    assert len(run.spark_quarantine) == len(run.quarantine1)
    assert "interval_id:string" in run.driver["events_schema"] and "date:date" in run.driver["events_schema"]
    py = {r["stream_seq"]: _normalize(r) for r in run.events1}
    for row in run.spark_events:
        assert row["interval_id"] == IID
        got = _normalize(row)
        exp = py[row["stream_seq"]]
        for name in schemas.EVENTS_COLUMNS:
            assert got[name] == exp[name], (row["stream_seq"], name)
    pq_rows = {r["stream_seq"]: r for r in run.quarantine1}
    for row in run.spark_quarantine:
        for name in schemas.QUARANTINE_COLUMNS:
            want = pq_rows[row["stream_seq"]][name]
            got = row[name]
            if name == "headers" and got is not None:
                got, want = dict(got), dict(want)
            assert got == want, (row["stream_seq"], name)
