"""The one listing of the interval ledger: which time intervals were planned, which were summarized.

``{root}/_ledger/{stream}/interval=<start>_<end>/`` holds ``stream.json`` once ``plan`` of the
interval ran and ``summary.json`` once its ``summary`` ran (:mod:`airflow_provider_plgd.tables.ledger`).
One glob of the stream's folder answers both (not one request per interval: object stores).
Sequence and durable intervals are not chained by the ledger, and folders that are not interval
IDs are not ours: both are left out.

Pure Python + fsspec (no Airflow): the chain's guards (``ledger_guards``, ``chain``) and the status
view (``airflow_provider_plgd.status``) read it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from airflow_provider_plgd.tables import storage
from airflow_provider_plgd.tables.layout import Layout
from airflow_provider_plgd.tables.ledger import PLAN_FILE, SUMMARY_FILE
from airflow_provider_plgd.times import IntervalId

_PREFIX = "interval="


@dataclass(frozen=True)
class LedgerListing:
    """The time intervals of one stream's ledger.

    :ivar planned: the intervals with a plan record (``stream.json``), oldest first.
    :ivar summarized: the intervals with a ``summary.json``.
    """

    planned: tuple[IntervalId, ...]
    summarized: frozenset[IntervalId]

    def planned_before(self, start_ns: int) -> list[IntervalId]:
        """The planned intervals that end at or before ``start_ns`` (unix ns), oldest first."""
        return [i for i in self.planned if i.high <= start_ns]


def list_ledger(layout: Layout, stream: str) -> LedgerListing:
    """List ``{root}/_ledger/{stream}/`` once (module docstring); empty when it does not exist.

    :raises ValueError: a stream name that is not safe in a path.
    """
    fs, base = storage.to_fs(layout.ledger_stream_dir(stream))
    try:
        paths = [str(p).rstrip("/") for p in fs.glob(f"{base}/{_PREFIX}*/*.json")]
    except FileNotFoundError:
        return LedgerListing((), frozenset())
    planned, summarized = set(), set()
    for path in paths:
        folder, name = path.rsplit("/", 2)[-2:]
        interval = IntervalId.parse_or_none(folder[len(_PREFIX):]) if folder.startswith(_PREFIX) else None
        if interval is None or interval.kind != "time":
            continue
        if name == PLAN_FILE:
            planned.add(interval)
        elif name == SUMMARY_FILE:
            summarized.add(interval)
    return LedgerListing(tuple(sorted(planned)), frozenset(summarized))


def never_planned(planned: Sequence[IntervalId]) -> list[tuple[int, int]]:
    """The stretches ``(start_ns, end_ns)`` between the earliest and the latest of ``planned``
    (time intervals, oldest first) that no planned interval covers, oldest first."""
    gaps = []
    covered = planned[0].high if planned else 0
    for interval in planned[1:]:
        if interval.low > covered:
            gaps.append((covered, interval.low))
        covered = max(covered, interval.high)
    return gaps
