"""Benchmark: the first load of the plgd page (``airflow_provider_plgd.ui``) on a year of hourly intervals.

Writes a storage root with 8,760 hourly plan records (``stream.json``, as ``plan`` writes them;
``--summaries``: the newest N also get a ``summary.json`` that reconciles; no Delta table: every
interval is then not committed, the costliest case for the status view, which reads the plan of
each interval dedupe did not commit) on the local disk, then times what the api-server does for
the page's first load, as :mod:`airflow_provider_plgd.ui.api` does it:

1. ``chain_status`` (the status view, read once per ``CACHE_SECONDS``), then ``interval_rows``;
2. the summary route: ``pipeline_summary`` (states, overview of 120 stretches);
3. the first page of intervals (``page``, 100 newest) with the cached rows.

``--committed``: dedupe committed all but the newest two (the usual chain: the status view reads
no plan of a committed interval), given to the status view as its dedupe log with stand-ins for the
two Delta tables that answer ``transaction_version`` (the Delta logs' read is not timed here).
``--profile`` prints the 15 costliest functions of step 1 (cProfile, cumulative). Figures, not a
test. Usage: ``python -m bench.bench_ui_status [--intervals 8760] [--summaries 48] [--committed] [--profile]``.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time

from airflow_provider_plgd import times
from airflow_provider_plgd.status import chain_status
from airflow_provider_plgd.tables import chain, ledger, storage
from airflow_provider_plgd.tables.layout import Layout
from airflow_provider_plgd.ui import timeline

HOUR = 3600 * 10**9
START = 1_735_689_600 * 10**9  # 2025-01-01T00:00:00Z


def write_root(root: str, intervals: int, summaries: int) -> list[str]:
    """The plan records (and the newest ``summaries`` summaries) of ``intervals`` hourly intervals."""
    layout = Layout.of(root)
    ids = []
    for k in range(intervals):
        interval_id = times.interval_id(START + k * HOUR, START + (k + 1) * HOUR)
        first, count = 1 + k * 100, 100 if k % 50 else 0  # every 50th interval empty
        counted = {"stream": "EVENTS", "created": "2025-01-01T00:00:00Z", "state": {}, "first_seq": first,
                   "end_seq_exclusive": first + count, "total": count, "scope_total": count, "read_total": count,
                   "ranges": [{"first_seq": first, "end_seq_exclusive": first + count, "count": count}] if count else []}
        record = ledger.PlanRecord.of(counted, interval_id=interval_id,
                                      bounds=times.Interval.from_id(interval_id).bounds(), owners=None,
                                      event_types=["resourcechanged"], read_filters=[ledger.SCOPE_FILTER]).as_dict()
        folder = layout.ledger_interval_dir("EVENTS", interval_id)
        ledger.write_ledger_file(storage.join_path(folder, "stream.json"), record)
        if k >= intervals - summaries:
            ledger.write_ledger_file(storage.join_path(folder, "summary.json"),
                                     {"version": ledger.LEDGER_VERSION, "interval_id": interval_id, "stream": "EVENTS",
                                      "chain": {}, "problems": [], "reconciled": True})
        ids.append(interval_id)
    return ids


class _CommittedTable:
    """Stands in for a Delta table whose log holds one dedupe transaction per committed interval."""

    def __init__(self, committed: set[str]) -> None:
        self.committed = committed

    def transaction_version(self, app_id: str) -> int | None:
        return 1 if app_id.rsplit("/", 1)[-1] in self.committed else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--intervals", type=int, default=8760)
    parser.add_argument("--summaries", type=int, default=48)
    parser.add_argument("--committed", action="store_true")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="plgd-bench-ui-") as root:
        t0 = time.perf_counter()
        ids = write_root(root, args.intervals, args.summaries)
        if args.committed:
            done = ids[:-2]
            table = _CommittedTable(set(done))
            log = chain.DedupeLog(table, table, tuple(times.IntervalId.parse(i) for i in done))
            chain.dedupe_log = lambda _layout: log  # type: ignore[assignment]  # this process only
        print(f"{args.intervals:,} plan records written in {time.perf_counter() - t0:.1f} s")
        profiler = cProfile.Profile() if args.profile else None
        t0 = time.perf_counter()
        if profiler:
            profiler.enable()
        view = chain_status(root, "EVENTS")
        if profiler:
            profiler.disable()
        t1 = time.perf_counter()
        rows = timeline.interval_rows(view, since_ns=START)
        t2 = time.perf_counter()
        summary = timeline.pipeline_summary(view, rows, buckets=120)
        t3 = time.perf_counter()
        first = timeline.page(rows, limit=100)
        t4 = time.perf_counter()
        timeline.pipeline_summary(view, rows, buckets=120)  # the next request within CACHE_SECONDS
        again = time.perf_counter() - t4
        print(f"{'committed: all but 2' if args.committed else 'none committed'}: chain_status {t1 - t0:.2f} s; interval_rows {(t2 - t1) * 1000:.0f} ms; summary (states, "
              f"overview of {len(summary['overview'])}) {(t3 - t2) * 1000:.0f} ms; first page of "
              f"{len(first['items'])} {(t4 - t3) * 1000:.0f} ms; first load in all {t4 - t0:.2f} s; "
              f"the summary again (cached view) {again * 1000:.0f} ms")
        if profiler:
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(15)


if __name__ == "__main__":
    main()
