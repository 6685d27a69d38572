"""``plgd_devtools.spark.spark_lock``: Spark slots of the test harness (real ``flock`` on temp files,
threads as the concurrent holders: each ``open`` is its own lock owner)."""

from __future__ import annotations

import threading
import time

import pytest

from plgd_devtools.spark import SLOTS_ENV, spark_lock


def _holds(path: str, hold_s: float, log: list, name: str, **kw) -> threading.Thread:
    def run() -> None:
        with spark_lock(path, **kw):
            log.append(("in", name, time.monotonic()))
            time.sleep(hold_s)
            log.append(("out", name, time.monotonic()))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _overlap(log: list, a: str, b: str) -> bool:
    t = {(kind, name): at for kind, name, at in log}
    return t[("in", a)] < t[("out", b)] and t[("in", b)] < t[("out", a)]


@pytest.mark.parametrize("slots, together", [("1", False), ("2", True)])
def test_jobs_run_side_by_side_only_with_two_slots(tmp_path, monkeypatch, slots, together):
    monkeypatch.setenv(SLOTS_ENV, slots)
    monkeypatch.delenv("PLGD_SPARK_LOCK_HELD", raising=False)
    path, log = str(tmp_path / "spark.lock"), []
    threads = [_holds(path, 0.5, log, "a"), _holds(path, 0.5, log, "b")]
    for thread in threads:
        thread.join(10)
    assert len(log) == 4 and _overlap(log, "a", "b") is together, log


def test_alone_waits_for_every_slot_and_holds_them_all(tmp_path, monkeypatch):
    monkeypatch.setenv(SLOTS_ENV, "2")
    monkeypatch.delenv("PLGD_SPARK_LOCK_HELD", raising=False)
    path, log = str(tmp_path / "spark.lock"), []
    first = [_holds(path, 0.6, log, "a"), _holds(path, 0.6, log, "b")]
    time.sleep(0.2)
    alone = _holds(path, 0.4, log, "alone", alone=True)
    time.sleep(0.1)
    late = _holds(path, 0.2, log, "late")
    for thread in (*first, alone, late):
        thread.join(10)
    assert len(log) == 8, log
    assert not _overlap(log, "alone", "a") and not _overlap(log, "alone", "b") and not _overlap(log, "alone", "late")


def test_a_bad_slot_count_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv(SLOTS_ENV, "two")
    monkeypatch.delenv("PLGD_SPARK_LOCK_HELD", raising=False)
    with pytest.raises(ValueError, match="PLGD_SPARK_SLOTS='two'"), spark_lock(str(tmp_path / "spark.lock")):
        pass
