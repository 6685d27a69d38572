"""``ledger_guards.check_no_gap_before``: a stretch before an interval that no run planned is refused,
naming the stretch and the backfill that fills it (local ledger folders, no Airflow)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from airflow_provider_plgd import times
from airflow_provider_plgd.exceptions import IntervalGapError, LedgerError
from airflow_provider_plgd.tables import ledger, ledger_guards
from airflow_provider_plgd.tables.layout import Layout

H0 = datetime(2026, 11, 23, 10, tzinfo=timezone.utc)


def _iid(k: int) -> str:
    return times.interval_id(H0 + timedelta(hours=k), H0 + timedelta(hours=k + 1))


def _plan(root, k: int) -> None:
    ledger.write_ledger_file(f"{ledger.interval_dir(Layout.of(str(root)), 'EVENTS', _iid(k))}/stream.json", {"total": 0})


def test_first_interval_and_the_next_one_pass(tmp_path):
    ledger_guards.check_no_gap_before(Layout.of(str(tmp_path)), "EVENTS", _iid(0))  # no ledger at all
    _plan(tmp_path, 0)
    ledger_guards.check_no_gap_before(Layout.of(str(tmp_path)), "EVENTS", _iid(1))
    ledger_guards.check_no_gap_before(Layout.of(str(tmp_path)), "EVENTS", _iid(0))  # a rerun of the only one
    _plan(tmp_path, 1)
    _plan(tmp_path, 2)
    ledger_guards.check_no_gap_before(Layout.of(str(tmp_path)), "EVENTS", _iid(1))  # a rerun of an older one
    ledger_guards.check_no_gap_before(Layout.of(str(tmp_path)), "EVENTS", "seq-000000000001-000000000009")  # not a time interval


def test_a_hole_is_refused_naming_the_missing_stretch_and_the_backfill(tmp_path):
    _plan(tmp_path, 0)
    with pytest.raises(IntervalGapError) as info:
        ledger_guards.check_no_gap_before(Layout.of(str(tmp_path)), "EVENTS", _iid(3), dag_id="plgd_events_etl")
    err = info.value
    assert isinstance(err, LedgerError) and err.interval_id == _iid(3)
    assert (err.gap_start_ns, err.gap_end_ns) == (times.to_ns(H0 + timedelta(hours=1)),
                                                  times.to_ns(H0 + timedelta(hours=3)))
    text = str(err)
    assert "no interval of [2026-11-23T11:00:00Z, 2026-11-23T13:00:00Z) was ever planned" in text, text
    assert ("airflow backfill create --dag-id plgd_events_etl \\\n    --from-date 2026-11-23T11:00:00Z "
            "--to-date 2026-11-23T13:00:00Z") in text, text
    assert max(map(len, text.splitlines())) <= 100, text
    # a folder without stream.json (plan never wrote it) does not count as planned
    (tmp_path / "_ledger" / "EVENTS" / f"interval={_iid(2)}").mkdir(parents=True)
    with pytest.raises(IntervalGapError, match=r"\[2026-11-23T11:00:00Z, 2026-11-23T13:00:00Z\)"):
        ledger_guards.check_no_gap_before(Layout.of(str(tmp_path)), "EVENTS", _iid(3))
    # filled: passes; another stream's ledger is its own
    _plan(tmp_path, 1)
    _plan(tmp_path, 2)
    ledger_guards.check_no_gap_before(Layout.of(str(tmp_path)), "EVENTS", _iid(3))
    ledger.write_ledger_file(f"{ledger.interval_dir(Layout.of(str(tmp_path)), 'OTHER', _iid(0))}/stream.json", {"total": 0})
    with pytest.raises(IntervalGapError):
        ledger_guards.check_no_gap_before(Layout.of(str(tmp_path)), "OTHER", _iid(3))


def test_a_hole_between_earlier_intervals_planned_out_of_order_is_refused(tmp_path):
    """``ledger_guards.check_no_hole_before``: what the scheduler leaves after a backfill of a later interval
    (0 scheduled, 2 backfilled and planned first, 1 never run): 3 passes the latest-only rule but
    is refused naming 1's hour and the backfill that fills it and reruns 2 and 3."""
    from airflow_provider_plgd.tables.ledger_guards import check_no_hole_before

    check_no_hole_before(Layout.of(str(tmp_path)), "EVENTS", _iid(3))  # no ledger at all
    _plan(tmp_path, 2)
    check_no_hole_before(Layout.of(str(tmp_path)), "EVENTS", _iid(3))  # the first planned on the root
    _plan(tmp_path, 0)
    ledger_guards.check_no_gap_before(Layout.of(str(tmp_path)), "EVENTS", _iid(3))  # the latest before it is adjacent
    with pytest.raises(IntervalGapError) as info:
        check_no_hole_before(Layout.of(str(tmp_path)), "EVENTS", _iid(3), dag_id="plgd_events_etl")
    err = info.value
    assert err.interval_id == _iid(3)
    assert (err.gap_start_ns, err.gap_end_ns) == (times.to_ns(H0 + timedelta(hours=1)),
                                                  times.to_ns(H0 + timedelta(hours=2)))
    text = str(err)
    assert "no interval of [2026-11-23T11:00:00Z, 2026-11-23T12:00:00Z) was ever planned" in text, text
    assert ("airflow backfill create --dag-id plgd_events_etl \\\n    --from-date 2026-11-23T11:00:00Z "
            "--to-date 2026-11-23T13:00:00Z \\\n    --reprocess-behavior completed") in text, text
    assert max(map(len, text.splitlines())) <= 100, text
    check_no_hole_before(Layout.of(str(tmp_path)), "EVENTS", _iid(1))  # the rerun of 1: only 0 before it
    check_no_hole_before(Layout.of(str(tmp_path)), "EVENTS", "seq-000000000001-000000000009")  # not a time interval
    _plan(tmp_path, 1)  # filled
    check_no_hole_before(Layout.of(str(tmp_path)), "EVENTS", _iid(3))
    check_no_hole_before(Layout.of(str(tmp_path)), "EVENTS", _iid(2))
