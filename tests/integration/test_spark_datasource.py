"""The Spark data source ``plgd-jetstream`` against a real nats-server and a local SparkSession.

One SparkSession (``local[2]``) for the module, holding the Spark lock. Its Python workers (the
driver-side planner and the executors' readers) cannot import Airflow: a ``sitecustomize`` on
their ``PYTHONPATH`` blocks it, as on executors that have only ``requirements-executor.txt``.
Ground truth comes from nats-py directly (``read_stream``), the Delta sink is read back with
``deltalake``, not with our code.
"""

from __future__ import annotations

import asyncio
import glob
import itertools
import json
import os
import time
from pathlib import Path

import nats
import pyarrow as pa
import pytest

from airflow_provider_plgd.exceptions import RangeChangedError
from airflow_provider_plgd.spark.datasource import REDACTED, JetStreamDataSource
from airflow_provider_plgd.tables.staging import SCHEMA
from plgd_devtools.nats_server import NatsServer, recreate_stream
from plgd_devtools.spark import FAST_LOCAL_SPARK_CONF, spark_lock, spark_submit_env
from tests.integration.conftest import publish_messages, read_stream

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
OWNER_A = "e1407479-3136-56c0-9908-bb02fb0339e2"
OWNER_B = "7c2b8a6e-4f0e-4b69-9a59-0c8a3f1d2e11"
PASSWORD = "s3cr3t-Pa55word-of-the-etl"

BLOCK_AIRFLOW = '''
import importlib.abc, sys
class _NoAirflow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "airflow" or name.startswith("airflow."):
            raise ImportError("Airflow is not installed on Spark executors (blocked by the test)")
sys.meta_path.insert(0, _NoAirflow())
'''


def subject(owner: str, i: int) -> str:
    return f"plgd.owners.{owner}.devices.0000000{i % 3}-0000-0000-0000-000000000000.metadata.devicemetadataupdated"


def messages(n: int, tag: str, owners=(OWNER_A, OWNER_B)) -> list[tuple]:
    """``n`` messages alternating between ``owners``; every 5th carries headers (one with a Nats-Msg-Id)."""
    out = []
    for i in range(n):
        headers = {"Nats-Msg-Id": f"{tag}-{i}", "x-plgd": "1"} if i % 5 == 0 else None
        out.append((subject(owners[i % len(owners)], i), f"{tag}-{i}".encode(), headers))
    return out


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    """A local SparkSession whose Python workers cannot import Airflow; its event log (what the
    Spark history UI shows) goes to ``spark.eventlog_dir``, uncompressed."""
    block = tmp_path_factory.mktemp("no-airflow")
    (block / "sitecustomize.py").write_text(BLOCK_AIRFLOW)
    eventlog = tmp_path_factory.mktemp("eventlog")
    env = {**spark_submit_env(), "PYTHONPATH": os.pathsep.join([str(block), str(REPO)])}
    with spark_lock(), pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.master("local[2]").appName("plgd-test-datasource")
        conf = {**FAST_LOCAL_SPARK_CONF, "spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC",
                "spark.eventLog.enabled": "true", "spark.eventLog.dir": str(eventlog),
                "spark.eventLog.compress": "false"}
        for key, value in conf.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        session.dataSource.register(JetStreamDataSource)
        session.eventlog_dir = str(eventlog)
        def import_airflow(batches):  # defined here: pickled by value (the workers cannot import tests/)
            for _ in batches:
                try:
                    import airflow  # noqa: F401
                    result = "imported"
                except ImportError as exc:
                    result = str(exc)
                yield pa.RecordBatch.from_pydict({"r": [result]})

        assert session.range(1).mapInArrow(import_airflow, "r string").first()["r"].startswith(
            "Airflow is not installed on Spark executors")
        try:
            yield session
        finally:
            session.stop()


def reader(spark, server, **options):
    r = spark.read.format("plgd-jetstream").option("servers", server.url)
    for key, value in options.items():
        r = r.option(key, str(value))
    return r


def rows_by_seq(df) -> dict[int, dict]:
    table = df.toArrow()
    assert table.schema.names == SCHEMA.names
    return {r["stream_seq"]: r for r in table.to_pylist()}


def expected_row(seq: int, stored: tuple) -> dict:
    subj, ts, headers, data = stored
    return {"stream": "EVENTS", "stream_seq": seq, "subject": subj, "msg_id": (headers or {}).get("Nats-Msg-Id"),
            "published_at_us": ts // 1000, "headers": sorted(headers.items()) if headers else None, "data": data}


def as_comparable(row: dict) -> dict:
    return {"stream": row["stream"], "stream_seq": row["stream_seq"], "subject": row["subject"],
            "msg_id": row["msg_id"], "published_at_us": int(row["published_at"].timestamp() * 1_000_000),
            "headers": sorted(row["headers"]) if row["headers"] else None, "data": row["data"]}


def publish_groups(url: str, sizes: tuple[int, ...]) -> list[list[int]]:
    """Publish groups of messages with a pause between them (distinct server times)."""
    groups = []
    for g, n in enumerate(sizes):
        if g:
            time.sleep(0.05)
        groups.append(publish_messages(url, messages(n, f"g{g}")))
    return groups


def purge(url: str, body: dict) -> None:
    async def run():
        nc = await nats.connect(url)
        try:
            resp = json.loads((await nc.request("$JS.API.STREAM.PURGE.EVENTS", json.dumps(body).encode(), 5)).data)
            assert resp.get("success"), resp
        finally:
            await nc.close()

    asyncio.run(run())


# ------------------------------------------------------------------------------------------------ batch


def test_time_bounds_exact_at_both_ends(spark, jetstream):
    """[start, end) on the server's clock: the messages just before start and at end stay out."""
    before, inside, after = publish_groups(jetstream.url, (6, 9, 4))
    stored = read_stream(jetstream.url)
    start_ns, end_ns = stored[inside[0]][1], stored[after[0]][1]
    assert stored[before[-1]][1] < start_ns and stored[inside[-1]][1] < end_ns

    got = rows_by_seq(reader(spark, jetstream, start=start_ns, end=end_ns).load())  # unix ns, exact
    assert sorted(got) == inside
    assert [as_comparable(got[s]) for s in inside] == [expected_row(s, stored[s]) for s in inside]

    # ISO 8601 (microseconds): the same messages when no other message shares their microsecond
    iso = reader(spark, jetstream, start=_iso(start_ns // 1000), end=_iso(end_ns // 1000)).load()
    assert sorted(rows_by_seq(iso)) == inside

    # a subject filter inside the bounds
    only_b = reader(spark, jetstream, start=start_ns, end=end_ns, subjects=f"plgd.owners.{OWNER_B}.>").load()
    assert sorted(rows_by_seq(only_b)) == [s for i, s in enumerate(inside) if i % 2 == 1]


def _iso(us: int) -> str:
    import datetime as dt

    return (dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=us)).isoformat()


def test_sequence_bounds_partitions_and_repeatable(spark, jetstream):
    """[start_seq, end_seq] inclusive, cut into partitions of at most max_partition_messages
    matching messages; the same bounds read twice give the same rows."""
    seqs = publish_messages(jetstream.url, messages(40, "s"))
    stored = read_stream(jetstream.url)
    wanted = [s for s in seqs[5:31] if OWNER_A in stored[s][0]]  # seqs 6..31, owner A only
    opts = {"start_seq": seqs[5], "end_seq": seqs[30], "subjects": f"plgd.owners.{OWNER_A}.>",
            "max_partition_messages": 4}
    df = reader(spark, jetstream, **opts).load()
    from pyspark.sql import functions as F

    per_part = {r["p"]: (r["n"], r["lo"], r["hi"]) for r in df.groupBy(F.spark_partition_id().alias("p"))
                .agg(F.count("*").alias("n"), F.min("stream_seq").alias("lo"), F.max("stream_seq").alias("hi"))
                .collect()}
    assert df.rdd.getNumPartitions() == len(per_part) >= -(-len(wanted) // 4)
    assert all(n <= 4 for n, _, _ in per_part.values()) and sum(n for n, _, _ in per_part.values()) == len(wanted)
    ranges = sorted((lo, hi) for _, lo, hi in per_part.values())
    assert all(a[1] < b[0] for a, b in itertools.pairwise(ranges))  # disjoint, ordered sequence ranges
    first = rows_by_seq(df)
    assert sorted(first) == wanted  # seqs[4] and seqs[31] (just outside) are not read
    again = rows_by_seq(reader(spark, jetstream, **opts).load())
    assert again == first

    # nothing in the range: an empty DataFrame with the staging columns
    empty = reader(spark, jetstream, start_seq=seqs[-1] + 1, end_seq=seqs[-1] + 5).load()
    assert empty.count() == 0 and empty.columns == SCHEMA.names


def test_purge_between_plan_and_read_fails_naming_the_range(spark, jetstream):
    """A DataFrame keeps its planned partitions: a purge before its next action fails the read
    with RangeChangedError naming the range, instead of returning fewer rows."""
    seqs = [s for g, owner in enumerate((OWNER_A, OWNER_B, OWNER_A))
            for s in publish_messages(jetstream.url, messages(10, f"p{g}", owners=(owner,)))]
    assert seqs == list(range(1, 31))
    df = reader(spark, jetstream, start_seq=1, end_seq=30, max_partition_messages=10).load()
    assert len(df.collect()) == 30  # plans 3 partitions: [1, 11), [11, 21), [21, 31)
    purge(jetstream.url, {"filter": f"plgd.owners.{OWNER_B}.>"})  # the middle range: seqs 11-20
    gone = seqs[10:20]
    with pytest.raises(Exception) as failed:
        df.collect()
    text = str(failed.value)
    assert "RangeChangedError" in text and "stream sequences [11, 21): 0 messages read, but the server counted 10" in text, text[:3000]
    # a new read plans on what the stream holds now
    assert sorted(rows_by_seq(reader(spark, jetstream, start_seq=1, end_seq=30).load())) == \
        [s for s in seqs if s not in gone]
    # the same sequences in a re-created stream are other messages: refused, even with the same counts
    recreate_stream(jetstream.url)
    publish_messages(jetstream.url, messages(30, "r"))
    with pytest.raises(Exception, match=r"RangeChangedError.*was re-created"):
        df.collect()


def test_purge_in_the_middle_of_a_partition(jetstream, caplog, monkeypatch):
    """The reader as an executor runs it (no Spark needed): a purge while a partition is read
    fails it with the range; the planning log shows the options with the secrets redacted."""
    import logging

    from airflow_provider_plgd.jetstream import pull

    # after the purge the reader's next pull waits for messages until it expires (30 s): shorten it
    monkeypatch.setattr(pull, "PULL_EXPIRES_S", 2.0)

    publish_messages(jetstream.url, messages(5000, "m", owners=(OWNER_A,)))
    source = JetStreamDataSource({"servers": jetstream.url, "password": PASSWORD, "token": "tok-" + PASSWORD})
    # (a server without authorization accepts the credentials it does not check)
    batch_reader = source.reader(source.schema())
    with caplog.at_level(logging.INFO, logger="airflow_provider_plgd"):
        parts = batch_reader.partitions()
    assert [(p.first_seq, p.end_seq_exclusive, p.count) for p in parts] == [(1, 5001, 5000)]
    assert PASSWORD not in caplog.text and REDACTED in caplog.text and "[1, 5001): 5000 messages" in caplog.text
    batches = batch_reader.read(parts[0])
    first = next(batches)
    assert isinstance(first, pa.RecordBatch) and first.schema == SCHEMA and first.num_rows == 1000
    purge(jetstream.url, {})
    with pytest.raises(RangeChangedError) as failed:
        for _ in batches:
            pass
    assert (failed.value.first_seq, failed.value.end_seq_exclusive, failed.value.expected) == (1, 5001, 5000)
    assert failed.value.found < 5000 and "stream sequences [1, 5001)" in str(failed.value)


def test_incomplete_interval_and_bad_options_are_refused(spark, jetstream):
    publish_messages(jetstream.url, messages(3, "i"))
    now_ns = read_stream(jetstream.url)[3][1]
    with pytest.raises(Exception, match="IntervalNotCompleteError"):
        reader(spark, jetstream, start=now_ns - 10**9, end=now_ns + 3600 * 10**9).load().collect()
    with pytest.raises(Exception, match=r"unknown option.*'pasword'"):
        reader(spark, jetstream, pasword="x").load().collect()
    with pytest.raises(Exception, match=r"maxmessagespertrigger.*only for spark\.readStream"):
        reader(spark, jetstream, maxMessagesPerTrigger=5).load().collect()


def test_decode_on_executors(spark, jetstream):
    """docs/spark-datasource.md "Decoding": decode_batches in mapInArrow, and decode_message on one
    row, give the simulator's message IDs (a corrupt payload is quarantined, not dropped)."""
    from airflow_provider_plgd import decode_message
    from airflow_provider_plgd.simulator import SimulationConfig, generate
    from airflow_provider_plgd.spark import decode_batch, schemas

    sim = generate(SimulationConfig(seed=5, owners=1, devices_per_owner=2, resources_per_device=1, intervals=1,
                                    steps_per_interval=4, corrupt=1))
    publish_messages(jetstream.url, [(m.subject, m.data, None) for m in sim.messages])
    df = reader(spark, jetstream, max_partition_messages=5).load()
    decoded = df.mapInArrow(lambda batches: decode_batch.decode_batches(batches, "i0"),
                            schemas.union_spark_schema())
    rows = decoded.select("stream_seq", "msg_id", "reason", "interval_id").collect()
    assert len(rows) == len(sim.messages) and {r["interval_id"] for r in rows} == {"i0"}
    by_seq = {r["stream_seq"]: r for r in rows}
    for seq, m in enumerate(sim.messages, start=1):
        assert (by_seq[seq]["reason"] is None) == (m.fault != "corrupt")
        if m.fault != "corrupt":
            assert by_seq[seq]["msg_id"] == m.msg_id
    first = df.where("stream_seq = 1").first()
    assert decode_message(first.subject, first.data, msg_id=first.msg_id)["msg_id"] == sim.messages[0].msg_id


# ------------------------------------------------------------------------------------------------ credentials


def test_credentials_and_secrets_stay_out_of_plan_logs_and_errors(spark, tmp_path, capsys):
    config = f'authorization {{ users = [ {{user: "etl", password: "{PASSWORD}"}} ] }}\n'
    with NatsServer(config=config) as server:
        recreate_stream(server.url, user="etl", password=PASSWORD)
        publish = [(subject(OWNER_A, i), f"c-{i}".encode(), None) for i in range(12)]

        async def pub():
            nc = await nats.connect(server.url, user="etl", password=PASSWORD)
            js = nc.jetstream()
            for subj, data, _ in publish:
                await js.publish(subj, data)
            await nc.close()

        asyncio.run(pub())
        df = reader(spark, server, user="etl", password=PASSWORD, max_partition_messages=5).load()
        capsys.readouterr()
        df.explain(True)
        plan = capsys.readouterr().out + df._jdf.queryExecution().toString()
        assert "plgd-jetstream" in plan and PASSWORD not in plan
        assert sorted(r["data"] for r in df.collect()) == sorted(d for _, d, _ in publish)

        with pytest.raises(Exception) as refused:
            reader(spark, server, user="etl", password=PASSWORD + "-wrong").load().collect()
        assert "JetStreamAuthError" in str(refused.value) and PASSWORD not in str(refused.value)
        with pytest.raises(Exception, match="JetStreamAuthError"):
            reader(spark, server).load().collect()
        with pytest.raises(Exception, match="credentials before '@'") as in_url:
            spark.read.format("plgd-jetstream").option("servers", f"nats://etl:{PASSWORD}@{server.host}:1").load().collect()
        assert PASSWORD not in str(in_url.value)
    for path in glob.glob(os.path.join(spark.eventlog_dir, "**", "*"), recursive=True):
        if os.path.isfile(path):
            assert PASSWORD not in Path(path).read_text(errors="replace"), path


# ------------------------------------------------------------------------------------------------ streaming


def delta_sink(table_uri: str, app_id: str):
    """The foreachBatch function of docs/spark-datasource.md: each micro-batch is one Delta commit
    carrying (app_id, batch_id) as an app transaction; a batch the table already holds is skipped."""
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
    from deltalake.exceptions import TableNotFoundError

    def write_batch(batch_df, batch_id: int) -> None:
        try:
            done = DeltaTable(table_uri).transaction_version(app_id)
        except TableNotFoundError:
            done = None
        if done is not None and done >= batch_id:
            return  # committed before a restart: Spark replays the batch, the table keeps one copy
        write_deltalake(table_uri, batch_df.toArrow(), mode="append",
                        commit_properties=CommitProperties(app_transactions=[Transaction(app_id, batch_id)]))

    return write_batch


def test_streaming_available_now_twice_exactly_once(spark, jetstream, tmp_path):
    """maxMessagesPerTrigger bounds each micro-batch; Trigger.AvailableNow stops at the end; a
    second run with the same checkpoint reads only the new messages; a run that failed after the
    sink committed replays that batch, and the sink keeps one copy."""
    from deltalake import DeltaTable

    table, checkpoint = str(tmp_path / "events_raw"), str(tmp_path / "checkpoint")
    first = publish_messages(jetstream.url, messages(17, "a"))

    def run(sink):
        query = (spark.readStream.format("plgd-jetstream").option("servers", jetstream.url)
                 .option("maxMessagesPerTrigger", "7").option("password", PASSWORD).load()
                 .writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        return query

    query = run(delta_sink(table, "q1"))
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    assert [p["numInputRows"] for p in batches] == [7, 7, 3]
    assert json.loads(batches[-1]["sources"][0]["endOffset"])["next_seq"] == 18
    assert PASSWORD not in json.dumps(query.recentProgress, default=str)

    second = publish_messages(jetstream.url, messages(9, "b"))
    crashed = {"done": False}
    good = delta_sink(table, "q1")

    def sink_that_fails_once_after_commit(batch_df, batch_id):
        good(batch_df, batch_id)
        if not crashed["done"]:
            crashed["done"] = True
            raise RuntimeError("the driver died after the sink's commit")

    with pytest.raises(Exception, match="died after the sink's commit"):
        run(sink_that_fails_once_after_commit)
    run(good)

    stored = read_stream(jetstream.url)
    got = DeltaTable(table).to_pyarrow_table().to_pylist()
    assert sorted(r["stream_seq"] for r in got) == first + second == list(range(1, 27))
    assert {r["stream_seq"]: r["data"] for r in got} == {s: stored[s][3] for s in first + second}
    assert DeltaTable(table).transaction_version("q1") == 4  # batches 0-2, then 3 (7 new) and 4 (2 new)
