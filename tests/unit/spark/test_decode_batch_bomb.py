"""Decode bombs: a device controls its resource content, and snappy
expands up to ~21x. A 1,082,226-byte payload of zeros holds a 22 MiB content (30 M characters of
base64 JSON); a staging row group of 32 of them made one ``decode_batch`` call peak at 5.2 GB RSS.

The cap (``codec.DEFAULT_MAX_DECODED_BYTES`` = 4 MiB, decode app ``--max-content-bytes``, DAG param
``max_content_bytes``) is checked on the snappy header before anything is decompressed; such rows
go to quarantine as ``content_too_large`` with their raw payload.

Payloads are real plgd payloads built with the codec (``ResourceChanged`` with a 22 MiB
octet-stream content; an identity-store payload whose snappy block holds 22 MiB). Peak memory is
measured in a fresh process (``ru_maxrss`` growth over the decode, and ``tracemalloc``'s peak).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pytest
import snappy

from airflow_provider_plgd.plgd import codec, ids, subjects
from airflow_provider_plgd.plgd.pb import resourceaggregate_pb2 as ra

REPO = Path(__file__).resolve().parents[3]
INTERVAL = "20260101T000000Z_20260101T010000Z"
OWNER = ids.owner_id("alice")
DEV = "00000000-0000-0000-0000-000000000001"
HREF = "/light/1"
BOMB_CONTENT_BYTES = 22 * 1024 * 1024
MiB = 1024 * 1024


def bomb_rows(content_bytes: int = BOMB_CONTENT_BYTES) -> list[tuple[str, bytes]]:
    """(subject, payload): a resourcechanged event with ``content_bytes`` zeros as its content, and
    an identity-store payload whose snappy block decodes to as many zeros."""
    msg = ra.ResourceChanged(
        resource_id=ra.ResourceId(device_id=DEV, href=HREF),
        content=ra.Content(data=bytes(content_bytes), content_type="application/octet-stream",
                           coap_content_format=42),
        status=ra.Status.OK,
        event_metadata=ra.EventMetadata(version=1, timestamp=1, connection_id="c", sequence=1, hub_id="h"),
        audit_context=ra.AuditContext(user_id="u", correlation_id="c", owner="alice"),
    )
    resource = subjects.resource_subject(OWNER, DEV, ids.href_id(HREF), "resourcechanged")
    registrations = subjects.registrations_subject(OWNER, "devicesregistered")
    return [(resource, codec.encode_event(msg)), (registrations, snappy.compress(bytes(content_bytes)))]


def small_row() -> tuple[str, bytes]:
    msg = ra.ResourceChanged(
        resource_id=ra.ResourceId(device_id=DEV, href=HREF),
        content=ra.Content(data=b"\xa1\x65power\x05", content_type="application/vnd.ocf+cbor",
                           coap_content_format=10000),
        event_metadata=ra.EventMetadata(version=2, timestamp=2, hub_id="h"),
    )
    return subjects.resource_subject(OWNER, DEV, ids.href_id(HREF), "resourcechanged"), codec.encode_event(msg)


def staging_batch(rows: list[tuple[str, bytes]]) -> pa.RecordBatch:
    from datetime import datetime, timezone

    from airflow_provider_plgd.tables import staging

    n = len(rows)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(["EVENTS"] * n, pa.string()),
            pa.array(list(range(1, n + 1)), pa.int64()),
            pa.array([r[0] for r in rows], pa.string()),
            pa.array([datetime(2026, 1, 1, 0, 10, tzinfo=timezone.utc)] * n, pa.timestamp("us", tz="UTC")),
            pa.array([None] * n, pa.string()),
            pa.array([None] * n, pa.map_(pa.string(), pa.string())),
            pa.array([r[1] for r in rows], pa.binary()),
        ],
        schema=staging.SCHEMA,
    )


@pytest.fixture(scope="module")
def bombs():
    return bomb_rows()


def test_the_bomb_is_the_one_of_the_issue(bombs):
    from airflow_provider_plgd.plgd.pb import eventbus_pb2

    resource_payload = bombs[0][1]
    assert 1_000_000 < len(resource_payload) < 1_100_000  # ~1.08 MB on the wire
    data = eventbus_pb2.Event.FromString(resource_payload).data
    assert len(snappy.uncompress(data)) > BOMB_CONTENT_BYTES  # 22 MiB inside
    # without the cap the codec decodes it (what the decode app did before)
    decoded = codec.decode_payload(bombs[0][0], resource_payload, max_decoded_bytes=None)
    assert len(decoded.message.content.data) == BOMB_CONTENT_BYTES


def test_codec_refuses_the_bomb_before_decompressing(bombs):
    for subject, payload in bombs:
        tracemalloc.start()
        try:
            with pytest.raises(codec.PlgdDecodeError) as err:
                codec.decode_payload(subject, payload)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert err.value.reason == "content_too_large"
        declared = re.search(r"would decode to (\d+) bytes", str(err.value))
        assert declared and int(declared.group(1)) >= BOMB_CONTENT_BYTES, str(err.value)
        assert f"cap of {codec.DEFAULT_MAX_DECODED_BYTES} bytes" in str(err.value)
        assert peak < 2 * MiB, f"decoding allocated {peak} bytes: the block was decompressed"
    assert "content_too_large" in codec.DECODE_ERROR_REASONS


def test_cap_is_a_setting_and_contents_under_it_decode(bombs):
    """A content just under the cap decodes in full; the same with a lower cap is quarantined."""
    subject, payload = bomb_rows(3 * MiB)[0]
    decoded = codec.decode_payload(subject, payload)
    assert len(decoded.message.content.data) == 3 * MiB
    with pytest.raises(codec.PlgdDecodeError) as err:
        codec.decode_payload(subject, payload, max_decoded_bytes=MiB)
    assert err.value.reason == "content_too_large" and f"cap of {MiB} bytes" in str(err.value)
    # a corrupt snappy header is still bad_snappy, not content_too_large
    with pytest.raises(codec.PlgdDecodeError) as err:
        codec.decode_identity_store_payload(b"\xff\xff\xff\xff\xff\xff")
    assert err.value.reason == "bad_snappy"


def test_decode_batch_quarantines_bombs_keeping_the_raw_payload(bombs):
    from airflow_provider_plgd.spark.decode_batch import decode_batch

    rows = [bombs[0]] * 3 + [small_row(), bombs[1]]
    out = decode_batch(staging_batch(rows), INTERVAL).to_pylist()
    by_seq = {r["stream_seq"]: r for r in out}
    assert len(out) == 5
    for seq in (1, 2, 3, 5):
        row = by_seq[seq]
        assert row["reason"] == "content_too_large" and row["stage"] == "decode"
        assert row["data"] == rows[seq - 1][1]  # the raw payload, unchanged
        assert row["content_json"] is None and row["content_data"] is None
    assert by_seq[4]["reason"] is None and by_seq[4]["content_json"] == '{"power":5}'


#: Runs in a fresh process: builds 8 bomb rows (the issue's row group had 32), then decodes them
#: with decode_batch and reports the growth of the peak RSS and tracemalloc's peak over the call.
_CHILD = r"""
import json, resource, sys, tracemalloc
sys.path[:0] = [{repo!r}, {tests!r}]
from test_decode_batch_bomb import bomb_rows, staging_batch, INTERVAL
from airflow_provider_plgd.spark.decode_batch import decode_batch
batch = staging_batch(bomb_rows()[:1] * 8)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tracemalloc.start()
out = decode_batch(batch, INTERVAL)
peak = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"rss_growth_kib": after - before, "traced_peak": peak,
                   "reasons": out.column("reason").to_pylist(), "rows": out.num_rows}}))
"""


def test_decode_batch_memory_stays_bounded_in_a_fresh_process():
    code = _CHILD.format(repo=str(REPO), tests=str(Path(__file__).parent))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["rows"] == 8 and result["reasons"] == ["content_too_large"] * 8
    # today's code: ~8 x 22 MiB inner events + contents + 30 M-character JSON strings (> 500 MB)
    assert result["rss_growth_kib"] * 1024 < 64 * MiB, result
    assert result["traced_peak"] < 16 * MiB, result


def test_decode_app_cli_setting():
    from plgd_devtools.spark import spark_app_module

    parse_args = spark_app_module("decode_events").parse_args

    base = ["--root", "/r", "--interval-id", INTERVAL]
    assert parse_args(base).max_content_bytes == codec.DEFAULT_MAX_DECODED_BYTES == 4 * MiB
    assert parse_args([*base, "--max-content-bytes", "1048576"]).max_content_bytes == MiB
    for bad in ("0", "-1", "4MiB"):
        with pytest.raises(SystemExit):
            parse_args([*base, "--max-content-bytes", bad])


def test_etl_dag_passes_the_dag_authors_limit_to_the_decode_app():
    """The limit is part of the pipeline's identity: the author's value, fixed in the command line
    (a run's conf cannot change it; ``run_params.check_identity_params``)."""
    from datetime import datetime, timezone

    from airflow_provider_plgd.etl import DEFAULT_PARAMS, build_etl_dag

    assert DEFAULT_PARAMS["max_content_bytes"] == codec.DEFAULT_MAX_DECODED_BYTES
    dag = build_etl_dag(start_date=datetime(2026, 1, 1, tzinfo=timezone.utc))
    args = dag.get_task("decode").application_args
    assert args[args.index("--max-content-bytes") + 1] == str(codec.DEFAULT_MAX_DECODED_BYTES)
    dag = build_etl_dag(dag_id="small", start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
                        params={"max_content_bytes": 1000})
    args = dag.get_task("decode").application_args
    assert args[args.index("--max-content-bytes") + 1] == "1000"
