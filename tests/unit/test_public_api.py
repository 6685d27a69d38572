"""The public functions of the package root: ``decode_message`` and ``read_snapshot``.

``decode_message`` must give, for every event type, exactly the ``events`` row that the decode
application's code (``decode_batch``) gives for the same message, and raise ``PlgdDecodeError``
with the quarantine reason for a message that does not decode. ``read_snapshot`` reads a real
snapshot written by the rebuild code (``snapshot_store``), by version and latest.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import airflow_provider_plgd
from airflow_provider_plgd.plgd import codec
from airflow_provider_plgd.spark import schemas
from airflow_provider_plgd.spark.decode_batch import decode_batch
from tests.unit.spark.decode_cases import INTERVAL, PUBLISHED, _corrupt_rows, all_cases, rows_by_seq, staging_batch


def test_decode_message_equals_the_events_row_of_the_decode_application():
    cases = all_cases()
    app_rows = rows_by_seq(decode_batch(staging_batch([(s, d) for _, s, d, _ in cases]), INTERVAL))
    for seq, (event_type, subject, data, _cols) in enumerate(cases, start=1):
        row = airflow_provider_plgd.decode_message(subject, data, stream="EVENTS", stream_seq=seq,
                                                   published_at=PUBLISHED, interval_id=INTERVAL)
        assert list(row) == list(schemas.EVENTS_COLUMNS), event_type
        assert row == {name: app_rows[seq][name] for name in schemas.EVENTS_COLUMNS}, event_type


def test_decode_message_without_stream_facts_leaves_them_null_and_keeps_the_header_msg_id():
    _event_type, subject, data, _ = next(c for c in all_cases() if c[0] == "resourcechanged")
    row = airflow_provider_plgd.decode_message(subject, data, msg_id="hdr-1")
    assert row["event_type"] == "resourcechanged" and row["msg_id"] == "hdr-1"
    assert row["stream"] is None and row["stream_seq"] is None and row["interval_id"] is None


@pytest.mark.parametrize("reason, message", _corrupt_rows())
def test_decode_message_raises_the_quarantine_reason(reason, message):
    subject, data = message[0], message[1]
    with pytest.raises(codec.PlgdDecodeError) as err:
        airflow_provider_plgd.decode_message(subject, data)
    assert err.value.reason == reason


def test_decode_message_refuses_wrong_types():
    with pytest.raises(TypeError, match="payload must be bytes, got str"):
        airflow_provider_plgd.decode_message("plgd.owners.x", "not bytes")


def test_read_snapshot_is_the_snapshot_store_reader_and_the_root_stays_light():
    from airflow_provider_plgd.tables import snapshot_store

    assert airflow_provider_plgd.read_snapshot is snapshot_store.read_snapshot
    with pytest.raises(AttributeError):
        airflow_provider_plgd.no_such_name  # noqa: B018
    code = ("import sys, airflow_provider_plgd; "
            "heavy = [m for m in sys.modules if m.split('.')[0] in ('pyarrow', 'airflow', 'pyspark')]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_read_snapshot_unknown_table_and_version(tmp_path):
    with pytest.raises(ValueError, match="unknown snapshot table 'nope'"):
        airflow_provider_plgd.read_snapshot(str(tmp_path), "nope")
    with pytest.raises(ValueError, match="no snapshot version '20260101T000000Z'"):
        airflow_provider_plgd.read_snapshot(str(tmp_path), "resources", "20260101T000000Z")
    assert airflow_provider_plgd.read_snapshot(str(tmp_path), "resources").num_rows == 0
