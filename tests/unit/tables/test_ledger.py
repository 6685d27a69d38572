"""ledger.PlanRecord / PlanRange / FetchRecord: typed records whose JSON is the stored files' JSON,
byte for byte (``ledger.write_json``)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from airflow_provider_plgd import times
from airflow_provider_plgd.tables import ledger, ledger_accounting

START_NS = 1_767_225_600 * 10**9
COUNTED = {"stream": "EVENTS", "created": "2026-01-01T00:00:00Z", "state": {"messages": 100, "last_seq": 100},
           "first_seq": 41, "end_seq_exclusive": 60, "total": 17, "scope_total": 15, "read_total": 12,
           "ranges": [{"first_seq": 41, "end_seq_exclusive": 50, "count": 7},
                      {"first_seq": 50, "end_seq_exclusive": 60, "count": 5}]}


def stored(value) -> bytes:
    return (json.dumps(value, indent=1, sort_keys=True) + "\n").encode()


def test_plan_record_round_trips_byte_for_byte(tmp_path):
    window = times.Interval(START_NS, START_NS + 3600 * 10**9)
    plan = ledger.PlanRecord.of(COUNTED, interval_id=window.id, bounds=window.bounds(), owners=["o1", "o2"],
                                event_types=["devicesregistered"], read_filters=["plgd.owners.o1.>", "plgd.owners.o2.>"])
    as_dict = plan.as_dict()
    assert (as_dict["total"], as_dict["fetch_ranges"], as_dict["not_requested"], as_dict["deleted_in_range"],
            as_dict["seq_span"]) == (12, 2, 3, 2, 19)
    assert as_dict["ranges"][1] == {"index": 1, "first_seq": 50, "end_seq_exclusive": 60, "count": 5}
    path = tmp_path / "stream.json"
    ledger.write_ledger_file(str(path), as_dict)
    again = ledger.PlanRecord.from_dict(ledger.read_ledger_file(str(path)))
    assert again == plan and stored(again.as_dict()) == path.read_bytes()
    assert plan.range("1") == ledger.PlanRange(1, 50, 60, 5) == ledger.PlanRecord.from_dict(as_dict).range(1)
    with pytest.raises(ValueError, match="does not exist"):
        plan.range(2)
    with pytest.raises(ValueError, match="ledger version 1"):
        ledger.PlanRecord.from_dict({**as_dict, "version": 1})


def test_fetch_record_round_trips_byte_for_byte(tmp_path):
    rng = ledger.PlanRange(3, 41, 50, 7)
    types = {"resourcechanged": {"count": 2, "bytes": 9, "batches": 2, "files": 1, "first_seq": 41, "last_seq": 44},
             "devicesregistered": {"count": 4, "bytes": 8, "batches": 1, "files": 1, "first_seq": 42, "last_seq": 49}}
    as_dict = ledger.FetchRecord(interval_id="i", stream="EVENTS", range=rng, staged=6, skipped={"b": 1, "a": 0},
                                 event_types=types, run_version=17, owners=2, unrouted=1, delta_version=4).as_dict()
    assert list(as_dict["event_types"]) == ["devicesregistered", "resourcechanged"] and list(as_dict["skipped"]) == ["a", "b"]
    assert (as_dict["owners"], as_dict["unrouted"], as_dict["run_version"], as_dict["version"]) == (2, 1, 17, 3)
    assert as_dict["range"] == {"index": 3, "first_seq": 41, "end_seq_exclusive": 50, "count": 7}
    path = tmp_path / ledger.range_record_name(3)
    ledger.write_ledger_file(str(path), as_dict)
    again = ledger.FetchRecord.from_dict(ledger.read_ledger_file(str(path)))
    assert again.range == rng and stored(again.as_dict()) == path.read_bytes()


def test_the_readers_return_records_and_keep_earlier_versions_as_json(tmp_path):
    from airflow_provider_plgd.exceptions import LedgerError
    from airflow_provider_plgd.tables.layout import Layout

    layout, window = Layout.of(str(tmp_path)), times.Interval(START_NS, START_NS + 3600 * 10**9)
    base = layout.ledger_interval_dir("EVENTS", window.key)
    assert ledger.read_plan(layout, "EVENTS", window.key) is None and ledger.read_records(layout, "EVENTS", window.id) == (None, [])
    plan = ledger.PlanRecord.of(COUNTED, interval_id=window.id, bounds=window.bounds(), owners=None,
                                event_types=["devicesregistered"], read_filters=[ledger.SCOPE_FILTER], run_version=5)
    ledger.write_ledger_file(f"{base}/{ledger.PLAN_FILE}", plan.as_dict())
    fetch = ledger.FetchRecord(interval_id=window.id, stream="EVENTS", range=plan.ranges[0], staged=7, skipped={},
                               event_types={"devicesregistered": {"count": 7}}, run_version=5)
    ledger.write_ledger_file(f"{base}/{ledger.FETCH_DIR}/{ledger.range_record_name(0)}", fetch.as_dict())
    earlier = {"version": 2, "interval_id": window.id, "range": {"index": 1}, "staged": 5, "owners": {"o1": 5}}
    ledger.write_ledger_file(f"{base}/{ledger.FETCH_DIR}/{ledger.range_record_name(1)}", earlier)
    assert ledger.read_plan(layout, "EVENTS", window.key) == plan
    got_plan, records = ledger.read_records(layout, "EVENTS", window.id)
    assert got_plan == plan and records == [fetch, ledger.EarlierRecord(earlier)]
    with pytest.raises(LedgerError, match=r"a fetch record of ledger version 2 \(expected 3\); range 1 \(sequences "
                                          r"\[50, 60\)\): the stream holds 5 messages, no fetch task recorded it"):
        ledger_accounting.staged_counts(got_plan, records)
    second = dataclasses.replace(fetch, range=plan.ranges[1], staged=5, event_types={"resourcechanged": {"count": 5}})
    assert ledger_accounting.staged_counts(got_plan, [fetch, second]) == {(0, "devicesregistered"): 7, (1, "resourcechanged"): 5}
    ledger.write_ledger_file(f"{base}/{ledger.PLAN_FILE}", {**plan.as_dict(), "version": 1})
    old = ledger.read_plan(layout, "EVENTS", window.key)
    assert isinstance(old, ledger.EarlierRecord) and (old.version, old.total, old.run_version) == (1, 12, 5)
    with pytest.raises(LedgerError, match="the plan has ledger version 1, expected 3"):
        ledger_accounting.staged_counts(old, records)
    broken = {k: v for k, v in plan.as_dict().items() if k != "ranges"}
    ledger.write_ledger_file(f"{base}/{ledger.PLAN_FILE}", broken)
    with pytest.raises(ValueError, match=r"stream.json is not a PlanRecord of ledger version 3: KeyError: 'ranges'"):
        ledger.read_plan(layout, "EVENTS", window.key)
