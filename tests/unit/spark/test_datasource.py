"""The plgd-jetstream data source without a server: option checks, secrets in logs, the Arrow rows,
and the split of a sequence range into partitions (with the server's count faked)."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import random

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

from airflow_provider_plgd.jetstream import counting
from airflow_provider_plgd.jetstream.connection import JetStreamSettings
from airflow_provider_plgd.jetstream.messages import StreamMessage
from airflow_provider_plgd.spark import datasource as ds
from airflow_provider_plgd.tables.staging import SCHEMA

SECRET = "hunter2-very-secret"


def parse(streaming: bool = False, **options):
    return ds.parse_options({"servers": "nats://127.0.0.1:4222", **options}, streaming=streaming)


def test_defaults_and_typed_values():
    opts = parse(start="2026-01-01T00:00:00Z", END="2026-01-01T01:00:00+00:00", subjects="plgd.owners.a.>, plgd.x",
                 start_seq="5", max_partition_messages="10", settle_seconds="0")
    assert opts.stream == "EVENTS" and opts.settings.servers == ("nats://127.0.0.1:4222",)
    assert opts.start_ns == int(dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc).timestamp()) * 10**9
    assert opts.end_ns - opts.start_ns == 3600 * 10**9
    assert opts.subjects == ("plgd.owners.a.>", "plgd.x") and opts.subject_filter == ["plgd.owners.a.>", "plgd.x"]
    assert (opts.start_seq, opts.end_seq, opts.max_partition_messages, opts.settle_seconds) == (5, None, 10, 0.0)
    base = parse()
    assert (base.subject_filter, base.max_partition_messages, base.settle_seconds, base.max_messages_per_trigger) == \
        (None, ds.DEFAULT_MAX_PARTITION_MESSAGES, ds.DEFAULT_SETTLE_SECONDS, None)
    assert parse(streaming=True, maxMessagesPerTrigger="7").max_messages_per_trigger == 7
    assert parse(start="1767225600000000000").start_ns == 1767225600000000000  # unix ns digits


@pytest.mark.parametrize("options, streaming, message", [
    ({"pasword": "x"}, False, r"unknown option\(s\) \['pasword'\]"),
    ({"end": "2026-01-01T00:00:00Z"}, True, r"\['end'\] is only for spark.read"),
    ({"maxMessagesPerTrigger": "5"}, False, r"\['maxmessagespertrigger'\] is only for spark.readStream"),
    ({"nkey_seed": SECRET}, False, "pass the NKEY seed as 'nkey_seed_secret'"),
    ({"servers": ""}, False, "option 'servers' is required"),
    ({"servers": f"nats://etl:{SECRET}@nats:4222"}, False, "credentials before '@'"),
    ({"servers": "http://nats:4222"}, False, "invalid NATS server URL"),
    ({"start": "2026-01-01T00:00:00"}, False, "option 'start' must be timezone-aware"),
    ({"start": "yesterday"}, False, "option 'start' 'yesterday' is not an ISO-8601 date-time"),
    ({"start": "2026-01-01T01:00:00Z", "end": "2026-01-01T00:00:00Z"}, False, "'end' .* must be after option 'start'"),
    ({"start_seq": "0"}, False, "option 'start_seq'"),
    ({"start_seq": "9", "end_seq": "3"}, False, r"option 'end_seq' \(3\) must be >= option 'start_seq' \(9\)"),
    ({"max_partition_messages": "lots"}, False, "option 'max_partition_messages'"),
    ({"subjects": "plgd.>.x"}, False, "option 'subjects': filter 'plgd.>.x' is not a valid NATS filter subject"),
    ({"stream": "EV.ENTS"}, False, "not a valid JetStream stream name"),
    ({"tls_key": "/k.pem"}, False, "'tls_key'.* is set but .*'tls_cert'"),
])
def test_bad_options_are_refused_by_name(options, streaming, message):
    with pytest.raises(ValueError, match=message) as refused:
        ds.parse_options({"servers": "nats://127.0.0.1:4222", **options}, streaming=streaming)
    assert SECRET not in str(refused.value)


def test_secrets_are_redacted_and_kept_out_of_repr():
    opts = parse(user="etl", password=SECRET, token=SECRET + "t", nkey_seed_secret="SUAXYZ" + SECRET)
    shown = ds.redacted_options({"servers": "nats://n:4222", "password": SECRET, "token": "t", "nkey_seed_secret": "s",
                                 "user": "etl", "spark.hadoop.fs.s3a.access.key": "AK"})
    assert shown == {"servers": "nats://n:4222", "password": ds.REDACTED, "token": ds.REDACTED,
                     "nkey_seed_secret": ds.REDACTED, "user": "etl", "spark.hadoop.fs.s3a.access.key": ds.REDACTED}
    assert SECRET not in repr(opts) and SECRET not in repr(opts.settings)
    # every secret option name matches Spark's default spark.redaction.regex
    assert all(ds.SECRET_OPTION.search(k) for k in ("password", "token", "nkey_seed_secret"))


def test_options_from_settings_round_trip():
    settings = JetStreamSettings(servers=("nats://a:4222", "nats://b:4222"), stream="MIRROR", user="etl",
                                 password=SECRET, creds_file=None, tls_ca="/ca.pem")
    options = ds.options_from_settings(settings)
    assert options == {"servers": "nats://a:4222,nats://b:4222", "stream": "MIRROR", "user": "etl",
                       "password": SECRET, "tls_ca": "/ca.pem"}
    again = ds.parse_options(options, streaming=False).settings
    assert (again.servers, again.stream, again.user, again.password, again.tls_ca) == \
        (settings.servers, "MIRROR", "etl", SECRET, "/ca.pem")


def test_record_batch_is_the_staging_schema():
    msgs = [StreamMessage(7, "plgd.a", 1_767_225_600_123_456_789, None, b"\x00\x01"),
            StreamMessage(9, "plgd.b", 1_767_225_601_000_000_999, {"Nats-Msg-Id": "m-9", "x": "y"}, b"")]
    batch = ds._to_record_batch("EVENTS", msgs)
    assert batch.schema == SCHEMA
    rows = batch.to_pylist()
    assert [r["stream_seq"] for r in rows] == [7, 9] and rows[0]["stream"] == rows[1]["stream"] == "EVENTS"
    assert rows[0]["published_at"] == dt.datetime(2026, 1, 1, 0, 0, 0, 123456, tzinfo=dt.timezone.utc)  # truncated
    assert (rows[0]["msg_id"], rows[0]["headers"], rows[0]["data"]) == (None, None, b"\x00\x01")
    assert (rows[1]["msg_id"], sorted(rows[1]["headers"])) == ("m-9", [("Nats-Msg-Id", "m-9"), ("x", "y")])
    assert ds._to_record_batch("EVENTS", []).num_rows == 0
    # Spark's own conversion of the schema the source declares agrees with the batches it gets
    assert ds.JetStreamDataSource({}).schema().fieldNames() == SCHEMA.names


@pytest.mark.parametrize("seed", range(6))
def test_split_range_bounds_every_partition(monkeypatch, seed):
    """Counts per range come from a fake server that holds a known set of matching sequences."""
    rnd = random.Random(seed)
    first, stop = rnd.randint(1, 50), rnd.randint(60, 3000)
    dense = rnd.random() < 0.5  # a filter that matches a burst, then little
    matching = sorted(s for s in range(first - 5, stop + 5)
                      if rnd.random() < (0.9 if dense and s < (first + stop) // 3 else 0.05))
    calls = []

    async def count_boundaries(api, stream, subject_filter, boundaries):
        calls.append(len(boundaries))
        return [sum(1 for s in matching if a <= s < b) for a, b in itertools.pairwise(boundaries)]

    monkeypatch.setattr(counting, "count_boundaries", count_boundaries)
    limit = rnd.choice([1, 3, 17, 100])
    ranges = asyncio.run(counting.split_range(None, "EVENTS", "plgd.>", first, stop, limit))
    assert ranges[0][0] == first and ranges[-1][1] == stop
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))  # contiguous
    assert all(c == sum(1 for s in matching if a <= s < b) for a, b, c in ranges)  # exact
    assert all(c <= limit for _, _, c in ranges)
    # merged: two neighbours never fit together
    assert all(x[2] + y[2] > limit for x, y in itertools.pairwise(ranges))
    total = sum(1 for s in matching if first <= s < stop)
    assert len(ranges) <= max(1, 2 * -(-total // limit))
    assert asyncio.run(counting.split_range(None, "EVENTS", None, 5, 5, 10)) == []


def test_empty_arrow_stand_in_partition_reads_nothing():
    from pyspark.sql.datasource import InputPartition

    opts = parse()
    assert list(ds._read(opts, InputPartition(None))) == []
    with pytest.raises(TypeError, match="reads SequenceRange partitions"):
        ds._read(opts, InputPartition(3))
    assert isinstance(ds._to_record_batch("E", []), pa.RecordBatch)
