"""The chain as a timeline (``airflow_provider_plgd.ui.timeline``): one state per planned interval
from a status view, pages, and the overview of a year of hourly intervals."""

from __future__ import annotations

import time

import pytest

from airflow_provider_plgd import times
from airflow_provider_plgd.status import ChainStatus, IntervalCount
from airflow_provider_plgd.ui import timeline

HOUR = 3600 * 10**9
START = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z


def ids(n: int) -> list[str]:
    return [times.interval_id(START + k * HOUR, START + (k + 1) * HOUR) for k in range(n)]


def view(planned: list[str], **fields) -> ChainStatus:
    base = dict(root="/r", stream="EVENTS", planned=len(planned), committed=0, empty=0, head=None, snapshot=None,
                holes=(), unfinished=(), failed=(), never_planned=(), tables=(), planned_ids=tuple(planned))
    return ChainStatus(**{**base, **fields})


def test_each_interval_gets_the_first_state_that_applies():
    i = ids(8)
    v = view(i, holes=(IntervalCount(i[1], 5),), unfinished=(IntervalCount(i[7], 9),),
             failed=((i[6], "dedupe: no run summary"),), stale=(i[3],),
             not_done=((i[3], "stale: deduplicated before ..."), (i[4], "not in the latest snapshot")),
             empty_ids=(i[5],))
    rows = timeline.interval_rows(v)
    assert [(r.interval_id, r.state) for r in rows] == [
        (i[0], "committed"), (i[1], "hole"), (i[2], "committed"), (i[3], "stale"), (i[4], "unfinished"),
        (i[5], "empty"), (i[6], "failed"), (i[7], "unfinished")]
    assert rows[1].messages == 5 and rows[7].messages == 9 and rows[5].messages == 0 and rows[0].messages is None
    assert rows[4].detail == "not in the latest snapshot" and rows[6].detail == "dedupe: no run summary"
    assert rows[0].start == "2026-01-01T00:00:00Z" and rows[0].end == "2026-01-01T01:00:00Z"
    assert timeline.state_counts(rows) == {"failed": 1, "hole": 1, "stale": 1, "unfinished": 2, "never_planned": 0,
                                           "empty": 1, "committed": 2}


def test_stretches_no_plan_recorded_are_rows_apart_from_the_holes():
    i = ids(6)  # planned: I1, I2, I4, I5 (I3 never planned); the DAG starts at I0's start
    gap = (times.ns_to_rfc3339(START + 3 * HOUR), times.ns_to_rfc3339(START + 4 * HOUR))
    v = view([i[1], i[2], i[4], i[5]], holes=(IntervalCount(i[2], 4),), never_planned=(gap,))
    rows = timeline.interval_rows(v, since_ns=START)
    assert [(r.interval_id, r.state) for r in rows] == [
        (i[0], "never_planned"), (i[1], "committed"), (i[2], "hole"), (i[3], "never_planned"), (i[4], "committed"),
        (i[5], "committed")]
    assert rows[0].detail == timeline.BEFORE_FIRST_DETAIL and rows[3].detail == timeline.NEVER_PLANNED_DETAIL
    assert timeline.state_counts(rows)["never_planned"] == 2 and timeline.state_counts(rows)["hole"] == 1
    assert [r.state for r in timeline.interval_rows(v)] == [r.state for r in rows[1:]]  # no start: no first row
    assert timeline.interval_rows(v, since_ns=START + HOUR) == rows[1:]  # the DAG starts with its first interval
    picked = timeline.page(rows, states=["never_planned"])
    assert [(x["interval_id"], x["start"], x["end"]) for x in picked["items"]] == [
        (i[3], gap[0], gap[1]), (i[0], times.ns_to_rfc3339(START), times.ns_to_rfc3339(START + HOUR))]


def test_pages_filter_and_order():
    i = ids(10)
    rows = timeline.interval_rows(view(i, holes=(IntervalCount(i[2], 1), IntervalCount(i[4], 1))))
    first = timeline.page(rows, offset=0, limit=3)
    assert first["total"] == 10 and [r["interval_id"] for r in first["items"]] == [i[9], i[8], i[7]]
    last = timeline.page(rows, offset=9, limit=3, newest_first=False)
    assert [r["interval_id"] for r in last["items"]] == [i[9]]
    holes = timeline.page(rows, states=["hole"])
    assert holes["total"] == 2 and [r["interval_id"] for r in holes["items"]] == [i[4], i[2]]
    for bad in ({"offset": -1}, {"limit": 0}, {"limit": timeline.MAX_PAGE + 1}, {"states": ["holes"]}):
        with pytest.raises(ValueError, match=r"offset|limit|unknown state"):
            timeline.page(rows, **bad)


def test_a_year_of_hourly_intervals_is_summarised_into_stretches():
    i = ids(8760)
    v = view(i, holes=(IntervalCount(i[100], 3),), empty_ids=tuple(i[:24]))
    t0 = time.perf_counter()
    rows = timeline.interval_rows(v)
    stretches = timeline.overview(rows, buckets=120)
    first_page = timeline.page(rows, limit=200)
    took = time.perf_counter() - t0
    print(f"\n8,760 intervals: rows, overview and a page in {took * 1000:.0f} ms")
    assert len(stretches) == 120 and sum(s["intervals"] for s in stretches) == 8760
    assert stretches[0]["counts"] == {"empty": 24, "committed": 49} and stretches[0]["worst"] == "empty"
    assert stretches[1]["worst"] == "hole" and stretches[1]["counts"]["hole"] == 1
    assert {s["worst"] for s in stretches[2:]} == {"committed"}
    assert stretches[-1]["last"] == i[-1] and len(first_page["items"]) == 200
    with pytest.raises(ValueError, match="buckets"):
        timeline.overview(rows, buckets=0)
