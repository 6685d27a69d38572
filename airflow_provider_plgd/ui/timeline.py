"""The chain as a timeline: one state per planned interval, paged and summarised (no Airflow here).

Everything comes from :func:`airflow_provider_plgd.status.chain_status` (the view ``plgd-etl status``
prints); this module only arranges it for the UI's page and JSON API (:mod:`.api`). An interval's
state, the first that applies:

* ``failed``: its ``summary.json`` says it does not reconcile (``ChainStatus.failed``);
* ``stale``: deduplicated before an earlier interval's rerun changed its message IDs (``stale``);
* ``hole``: the stream held messages for it, it is not committed, and a later interval is (``holes``);
* ``unfinished``: not committed yet after the chain's head (``unfinished``), or committed by dedupe
  but not done (``not_done``: not in the latest snapshot, no summary of its newest run, ...);
* ``empty``: the stream held no message for it;
* ``committed``: dedupe committed it and nothing above applies.

Time no ``plan`` recorded is no interval of the chain, but the page shows it apart from the holes:
a row of state ``never_planned`` for each such stretch between planned intervals
(``ChainStatus.never_planned``: a paused schedule, a backfill left undone) and for the time from
the DAG's start to its first planned interval (``since_ns``; catchup off, or a new root).

A year of hourly intervals is 8,760 rows: :func:`page` cuts them into pages (newest first by
default) and :func:`overview` folds them into at most ``buckets`` stretches, each with its counts
per state and its worst state (``failed`` > ``hole`` > ``stale`` > ``unfinished`` > ``never_planned`` >
``empty`` > ``committed``), which the page draws as one bar.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_plgd import times
from airflow_provider_plgd.status import ChainStatus

#: The states, worst first (:func:`overview`'s ``worst``).
STATES: tuple[str, ...] = ("failed", "hole", "stale", "unfinished", "never_planned", "empty", "committed")
#: The state of a stretch no ``plan`` recorded (not an interval of the chain; module docstring).
NEVER_PLANNED = "never_planned"
NEVER_PLANNED_DETAIL = "no plan recorded: no run planned this stretch (a paused schedule, a skipped or undone backfill)"
BEFORE_FIRST_DETAIL = "no plan recorded: from the DAG's start date to its first planned interval"
#: The states that are problems of the chain whatever their age (``ChainStatus.problems`` adds
#: unfinished intervals older than the newest planned one).
BAD_STATES = frozenset({"failed", "hole", "stale"})
#: Rows per page at most (:func:`page`).
MAX_PAGE = 1000
#: Stretches of :func:`overview` at most.
MAX_BUCKETS = 500


@dataclass(frozen=True)
class IntervalRow:
    """One planned time interval of the chain, or a stretch no plan recorded (state ``never_planned``).

    :ivar interval_id: its ID (:attr:`start`/:attr:`end`: its bounds, RFC 3339 UTC, parsed when asked).
    :ivar state: one of :data:`STATES`.
    :ivar messages: the stream's messages for it as its plan counted them; None when the status
        view did not read its plan (committed intervals), -1 when it has no plan record.
    :ivar detail: why it is in that state (the status view's words), or None.
    """

    interval_id: str
    state: str
    messages: int | None = None
    detail: str | None = None

    @property
    def start(self) -> str:
        return times.ns_to_rfc3339(times.Interval.from_id(self.interval_id).start_ns)

    @property
    def end(self) -> str:
        return times.ns_to_rfc3339(times.Interval.from_id(self.interval_id).end_ns)

    def as_dict(self) -> dict[str, Any]:
        """``{"interval_id", "start", "end", "state", "messages", "detail"}``."""
        window = times.Interval.from_id(self.interval_id)
        return {"interval_id": self.interval_id, "start": times.ns_to_rfc3339(window.start_ns),
                "end": times.ns_to_rfc3339(window.end_ns), "state": self.state, "messages": self.messages,
                "detail": self.detail}


def interval_rows(view: ChainStatus, *, since_ns: int | None = None) -> list[IntervalRow]:
    """Every planned interval of ``view`` with its state (module docstring), and the stretches no
    plan recorded (``never_planned``), oldest first.

    :param view: the status view (``chain_status``); its ``planned_ids`` lists the intervals, its
        ``never_planned`` the stretches between them (RFC 3339 ``(start, end)``).
    :param since_ns: the DAG's start (unix ns), or None: a ``never_planned`` row from it to the
        first planned interval when it is earlier.
    :return: one :class:`IntervalRow` per ``view.planned_ids`` entry and per stretch.
    """
    failed = dict(view.failed)
    stale = set(view.stale)
    holes = {h.interval_id: h.messages for h in view.holes}
    unfinished = {u.interval_id: u.messages for u in view.unfinished}
    not_done = dict(view.not_done)
    empty = set(view.empty_ids)
    rows = []
    for interval_id in view.planned_ids:
        messages = holes.get(interval_id, unfinished.get(interval_id))
        detail: str | None
        if interval_id in failed:
            state, detail = "failed", failed[interval_id]
        elif interval_id in stale:
            state, detail = "stale", not_done.get(interval_id)
        elif interval_id in holes:
            state, detail = "hole", "the stream holds messages for it; a later interval is committed"
        elif interval_id in unfinished:
            state, detail = "unfinished", "not committed yet (running, failed, or not run)"
        elif interval_id in not_done:
            state, detail = "unfinished", not_done[interval_id]
        elif interval_id in empty:
            state, detail, messages = "empty", None, 0
        else:
            state, detail = "committed", None
        rows.append(IntervalRow(interval_id, state, messages, detail))
    gaps = [IntervalRow(times.interval_id(start, end), NEVER_PLANNED, None, NEVER_PLANNED_DETAIL)
            for start, end in view.never_planned]
    if since_ns is not None and view.planned_ids:
        first = times.Interval.from_id(view.planned_ids[0]).start_ns
        if since_ns < first:
            gaps.append(IntervalRow(times.interval_id(since_ns, first), NEVER_PLANNED, None, BEFORE_FIRST_DETAIL))
    for gap in gaps:  # into the oldest-first rows, by start (a few parses per stretch)
        bisect.insort(rows, gap, key=_start_ns)
    return rows


def _start_ns(row: IntervalRow) -> int:
    return times.Interval.from_id(row.interval_id).start_ns


def state_counts(rows: Iterable[IntervalRow]) -> dict[str, int]:
    """``{state: number of rows}`` for every state of :data:`STATES` (0 included)."""
    counts = dict.fromkeys(STATES, 0)
    for row in rows:
        counts[row.state] += 1
    return counts


def check_states(states: Iterable[str] | None) -> frozenset[str] | None:
    """The state filter of a request: None (every state) or a set of :data:`STATES`.

    :raises ValueError: a state that is not one of :data:`STATES` (names it).
    """
    if states is None:
        return None
    chosen = frozenset(s for s in states if s)
    unknown = sorted(chosen - set(STATES))
    if unknown:
        raise ValueError(f"unknown state(s) {unknown}; expected some of {list(STATES)}")
    return chosen or None


def page(rows: Sequence[IntervalRow], *, offset: int = 0, limit: int = 200, states: Iterable[str] | None = None,
         newest_first: bool = True) -> dict[str, Any]:
    """One page of ``rows``: ``{"total", "offset", "limit", "items": [IntervalRow.as_dict()]}``.

    :param offset: rows skipped (>= 0), after the filter and in the chosen order.
    :param limit: rows at most, 1 to :data:`MAX_PAGE`.
    :param states: only rows in these states (None: all); ``total`` counts the filtered rows.
    :param newest_first: newest interval first (default), else oldest first.
    :raises ValueError: an offset < 0, a limit out of range, or an unknown state.
    """
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
    chosen = check_states(states)
    picked = [r for r in rows if chosen is None or r.state in chosen]
    ordered = picked[::-1] if newest_first else picked
    return {"total": len(picked), "offset": offset, "limit": limit,
            "items": [r.as_dict() for r in ordered[offset:offset + limit]]}


def overview(rows: Sequence[IntervalRow], *, buckets: int = 120) -> list[dict[str, Any]]:
    """``rows`` (oldest first) folded into at most ``buckets`` consecutive stretches of equal size.

    :return: oldest first, ``[{"start", "end", "first", "last" (interval IDs), "intervals",
        "counts": {state: n} (non-zero only), "worst": the worst state}]``.
    :raises ValueError: ``buckets`` not between 1 and :data:`MAX_BUCKETS`.
    """
    if not 1 <= buckets <= MAX_BUCKETS:
        raise ValueError(f"buckets must be between 1 and {MAX_BUCKETS}, got {buckets}")
    if not rows:
        return []
    size = -(-len(rows) // buckets)
    out = []
    for i in range(0, len(rows), size):
        chunk = rows[i:i + size]
        counts = {k: v for k, v in state_counts(chunk).items() if v}
        out.append({"start": chunk[0].start, "end": chunk[-1].end, "first": chunk[0].interval_id,
                    "last": chunk[-1].interval_id, "intervals": len(chunk), "counts": counts,
                    "worst": next(s for s in STATES if s in counts)})
    return out


def pipeline_summary(view: ChainStatus, rows: Sequence[IntervalRow], *, buckets: int = 120) -> dict[str, Any]:
    """The summary of one pipeline for the API: the status view's JSON (``as_dict(brief=True)``:
    chain, problems, tables with version/files/rows, lag), plus ``"states"`` (:func:`state_counts`),
    ``"healthy"`` (no problem) and ``"overview"`` (:func:`overview`)."""
    problems = view.problems()
    return {**view.as_dict(brief=True), "healthy": not problems, "problems_count": len(problems),
            "states": state_counts(rows), "overview": overview(rows, buckets=buckets)}
