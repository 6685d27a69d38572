"""times.IntervalId: the one value type of interval IDs (parsing, ordering, formatting)."""

from datetime import datetime, timezone

import pytest

from airflow_provider_plgd import times
from airflow_provider_plgd.spark.dedupe_job import previous_intervals
from airflow_provider_plgd.tables import maintenance
from airflow_provider_plgd.times import IntervalId

T0 = times.to_ns(datetime(2026, 1, 1, tzinfo=timezone.utc))
HALF_S = 500_000_000


def test_parse_formats_back_and_names_the_value_when_refused():
    for text in (times.interval_id(T0, T0 + HALF_S), times.seq_interval_id(1, 9), times.durable_interval_id(3, 3)):
        assert str(IntervalId.parse(text)) == text
    assert IntervalId.parse(times.seq_interval_id(2, 5)) == IntervalId("seq", 2, 5)
    with pytest.raises(ValueError, match=r"not a staging interval ID: 'junk' \(expected <start>_<end>"):
        IntervalId.parse("junk")
    with pytest.raises(ValueError, match=r"one spelling: 'seq-1-9' \(expected 'seq-000000000001-000000000009'\)"):
        IntervalId.parse("seq-1-9")
    with pytest.raises(ValueError, match="not a previous interval: 'seq-9-1'"):
        IntervalId.parse("seq-9-1", "previous interval")
    assert IntervalId.parse_or_none("junk") is None


def test_equal_to_its_text_and_ordered_by_time_not_by_text():
    whole = IntervalId.parse(times.interval_id(T0, T0 + HALF_S))  # 20260101T000000Z_...
    later = IntervalId.parse(times.interval_id(T0 + HALF_S, T0 + 2 * HALF_S))  # 20260101T000000.500000Z_...
    assert str(later) < str(whole)  # as text the later interval sorts first
    assert whole < later and whole.precedes(later) and not later.precedes(whole)
    assert whole == str(whole) and {str(whole): 1}[whole] == 1 and whole in {str(whole)}
    seq = IntervalId.parse(times.seq_interval_id(1, 9))
    assert not seq.same_kind(whole) and not seq.precedes(whole)
    assert IntervalId("seq", 1, 9).precedes(IntervalId("seq", 10, 12)) and not seq.precedes(IntervalId("seq", 9, 12))


def test_dedupe_looks_back_in_time_order():
    # committed_intervals lists the partitions sorted as text: the later interval first
    whole, later = times.interval_id(T0, T0 + HALF_S), times.interval_id(T0 + HALF_S, T0 + 2 * HALF_S)
    this = times.interval_id(T0 + 2 * HALF_S, T0 + 3 * HALF_S)
    assert previous_intervals(sorted([whole, later]), this, 1) == [later]
    assert previous_intervals(sorted([whole, later]), this, 2) == [whole, later]


def test_passed_intervals_in_time_order():
    whole, later = times.interval_id(T0, T0 + HALF_S), times.interval_id(T0 + HALF_S, T0 + 2 * HALF_S)
    head = times.interval_id(T0 + 2 * HALF_S, T0 + 3 * HALF_S)
    assert maintenance.passed_intervals([later, "junk", whole], head) == [whole, later]
