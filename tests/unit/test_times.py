"""airflow_provider_plgd.times: the one home of ns <-> datetime <-> RFC 3339 and interval IDs."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

from airflow_provider_plgd import times

UTC = timezone.utc
T0 = datetime(2026, 1, 1, tzinfo=UTC)
T0_NS = 1_767_225_600 * 10**9


def test_to_ns_typed_and_text_values():
    assert times.to_ns(T0) == T0_NS
    assert times.to_ns(T0 + timedelta(microseconds=5)) == T0_NS + 5_000
    assert times.to_ns(datetime(2026, 1, 1, 1, tzinfo=timezone(timedelta(hours=1)))) == T0_NS
    assert times.to_ns(T0_NS) == T0_NS
    assert times.to_ns(f" {T0_NS} ") == T0_NS
    assert times.to_ns("2026-01-01T00:00:00Z") == T0_NS
    with pytest.raises(TypeError, match=r"end_time must be a timezone-aware datetime or int unix ns, got str"):
        times.to_ns("2026-01-01", "end_time", text=False)
    with pytest.raises(ValueError, match=r"start_time must be timezone-aware .*2026-01-01T00:00:00"):
        times.to_ns(datetime(2026, 1, 1), "start_time")
    with pytest.raises(ValueError, match=r"t must be >= 0 unix ns, got -1"):
        times.to_ns(-1, "t")
    with pytest.raises(ValueError, match=r"t 'yesterday' is not an ISO-8601 date-time"):
        times.to_ns("yesterday", "t")
    with pytest.raises(TypeError, match="got bool"):
        times.to_ns(True, "t")


def test_rfc3339_both_ways():
    assert times.ns_to_rfc3339(T0_NS) == "2026-01-01T00:00:00Z"
    assert times.ns_to_rfc3339(T0_NS + 500_000) == "2026-01-01T00:00:00.000500Z"
    assert times.ns_to_rfc3339(T0_NS + 1) == "2026-01-01T00:00:00.000000001Z"
    for ns in (T0_NS, T0_NS + 500_000, T0_NS + 1, T0_NS + 123_456_789):
        assert times.parse_rfc3339_ns(times.ns_to_rfc3339(ns)) == ns
    assert times.parse_rfc3339_ns("2026-01-01T01:00:00.5+01:00") == T0_NS + 500_000_000
    assert times.parse_rfc3339_ns("0001-01-01T00:00:00Z") is None  # Go's zero time: an empty stream
    assert times.parse_rfc3339_ns("") is None and times.parse_rfc3339_ns(None) is None
    with pytest.raises(ValueError, match=r"stream timestamp 'noon' is not RFC 3339"):
        times.parse_rfc3339_ns("noon")


def test_interval_end_epoch():
    iid = times.interval_id(T0, T0 + timedelta(hours=1, microseconds=250))
    assert times.interval_end_epoch(iid) == pytest.approx(T0.timestamp() + 3600.00025)
    assert times.interval_end_epoch(times.seq_interval_id(1, 2)) is None
    assert times.interval_end_epoch("not-an-id") is None


def test_interval_bounds():
    assert times.Interval.of(T0, T0_NS + 1).bounds() == {
        "kind": "time", "start_ns": T0_NS, "end_ns": T0_NS + 1,
        "start": "2026-01-01T00:00:00Z", "end": "2026-01-01T00:00:00.000000001Z"}
    with pytest.raises(ValueError, match="must be after"):
        times.Interval.of(T0, T0)


def test_times_imports_no_airflow_and_no_pyarrow():
    """The Spark library imports it on executors: pure Python."""
    code = ("import sys, airflow_provider_plgd.times; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('airflow', 'pyarrow', 'pyspark')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
