"""times.Interval (the one value of an interval on the main flow) and the rebuild app's interval arguments."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from airflow_provider_plgd import times

UTC = timezone.utc
T0 = datetime(2026, 1, 1, tzinfo=UTC)
T0_NS = 1_767_225_600 * 10**9
HOUR_NS = 3600 * 10**9


def test_interval_of_from_id_and_bounds():
    window = times.Interval.of(T0, T0 + timedelta(hours=1))
    assert (window.start_ns, window.end_ns) == (T0_NS, T0_NS + HOUR_NS)
    assert window.id == times.interval_id(T0, T0 + timedelta(hours=1)) == "20260101T000000Z_20260101T010000Z"
    # the stored JSON of the manifests and the ledger: the same dict as before
    assert window.bounds() == {
        "kind": "time", "start_ns": T0_NS, "end_ns": T0_NS + HOUR_NS,
        "start": "2026-01-01T00:00:00Z", "end": "2026-01-01T01:00:00Z"}
    assert times.Interval.from_id(window.id) == window
    assert times.Interval.from_bounds(window.bounds()) == window
    odd = times.Interval(T0_NS + 1, T0_NS + 7)  # nanoseconds survive the ID
    assert times.Interval.from_id(odd.id) == odd
    assert times.Interval.of("2026-01-01T00:00:00Z", str(T0_NS + 5)) == times.Interval(T0_NS, T0_NS + 5)


def test_interval_refuses():
    with pytest.raises(ValueError, match="must be after its start"):
        times.Interval(T0_NS, T0_NS)
    with pytest.raises(TypeError, match="int unix ns"):
        times.Interval(T0, T0_NS)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a time interval"):
        times.Interval.from_id(times.seq_interval_id(1, 9))
    with pytest.raises(ValueError, match="not a staging interval ID"):
        times.Interval.from_id("x")
    with pytest.raises(ValueError, match="not time bounds"):
        times.Interval.from_bounds({"kind": "seq", "start_seq": 1, "end_seq": 2})
    with pytest.raises(ValueError, match="timezone-aware"):
        times.Interval.of(datetime(2026, 1, 1), T0)


def test_interval_kind_is_the_times_rule():
    assert times.interval_kind(times.durable_interval_id(1, 2)) == "durable"
    with pytest.raises(ValueError, match="not a staging interval ID"):
        times.interval_kind("seq-x")


def test_rebuild_snapshot_time_is_the_interval_end(capsys):
    from plgd_devtools.spark import spark_app_module

    rebuild_snapshots = spark_app_module("rebuild_snapshots")

    iid = "20260101T000000Z_20260101T010000Z"
    args = rebuild_snapshots.parse_args(["--root", "/r", "--interval-id", iid])
    assert args.interval == times.Interval.from_id(iid) and args.snapshot_time == T0_NS + HOUR_NS
    # a --snapshot-time is only checked: the interval end in either spelling passes
    for end in ("2026-01-01T01:00:00Z", str(T0_NS + HOUR_NS)):
        assert rebuild_snapshots.parse_args(
            ["--root", "/r", "--interval-id", iid, "--snapshot-time", end]).snapshot_time == T0_NS + HOUR_NS
    refused = {
        ("--snapshot-time", "2026-01-01T02:00:00Z"): "is not the end of --interval-id",
        ("--snapshot-time", "-5"): "neither unix nanoseconds",  # times.to_ns refuses it, so the app does
        ("--interval-id", "seq-000000000001-000000000009"): "not a time interval",
        ("--interval-id", "20260101T000000.000000Z_20260101T010000Z"): "one spelling",
    }
    for (flag, value), message in refused.items():
        argv = {"--root": "/r", "--interval-id": iid, flag: value}
        with pytest.raises(SystemExit):
            rebuild_snapshots.parse_args([x for kv in argv.items() for x in kv])
        assert message in capsys.readouterr().err
