"""Routing the messages of one owner-wide consumer to their batches and filters.

Each owner's messages are read through ONE consumer on ``plgd.owners.{owner}.>``; the server walks
the stream once per consumer, so this beats one consumer per (event type, filter) several times
(docs/performance.md, "Measurements behind design choices", M17). Routing on the client gives each
batch the same files as its own consumers would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_provider_plgd import ledger
from airflow_provider_plgd.plgd.subjects import parse_subject, subject_matches, subject_owner


class Router:
    """Routes the messages of an owner-wide consumer to ``(target index, filter index)``.

    A message goes to the target of its event type (``plgd.subjects.parse_subject``) and to the
    first of that target's filters it matches (``subject_matches``); a subject that does not parse
    is tried against every filter, so it is staged exactly as a per-filter consumer would have
    (decode quarantines it). Nothing is dropped silently:

    * a message of a known event type that was not requested is skipped and counted in
      :attr:`skipped` under ``ledger.SKIP_NOT_REQUESTED``;
    * every other message (an event type we do not know, e.g. from a newer hub, or a subject that
      does not parse and matches no requested filter) goes to the ``ledger.UNKNOWN_EVENT_TYPE``
      target when the group has one (decode quarantines it as ``unknown_event_type`` or
      ``bad_subject``), else it is counted as skipped under ``"unroutable"``.

    With ``unrouted=True`` (the unrouted fetch over ``ledger.SCOPE_FILTER``) the one target takes
    exactly the messages whose subject is not under ``plgd.owners.<valid owner ID>.``; the others
    are skipped as ``ledger.SKIP_OWNED`` (their owner's fetch stages them).
    """

    def __init__(self, group: list[tuple[str, str, list[str]]], *, unrouted: bool = False) -> None:
        from airflow_provider_plgd.plgd.event_types import EVENT_TYPES

        self.group = group
        self.unrouted = unrouted
        self.by_type: dict[str | None, int] = {event_type: i for i, (_, event_type, _) in enumerate(group)}
        self.unknown = self.by_type.get(ledger.UNKNOWN_EVENT_TYPE)
        self.requested = [i for i in range(len(group)) if i != self.unknown]
        self.known_types = EVENT_TYPES
        self.skipped: dict[str, int] = {}

    def _place(self, subject: str) -> tuple[int, int] | None:
        if self.unrouted:
            return None if subject_owner(subject) is not None else (0, 0)
        try:
            event_type = parse_subject(subject, check_event_type=False).event_type
        except ValueError:
            event_type, candidates = None, self.requested
        else:
            target = self.by_type.get(event_type)
            if target is not None and target != self.unknown:
                filters = self.group[target][2]
                if len(filters) == 1:
                    return target, 0
                candidates = [target]
            elif event_type in self.known_types:
                self.skipped[ledger.SKIP_NOT_REQUESTED] = self.skipped.get(ledger.SKIP_NOT_REQUESTED, 0) + 1
                return None
            else:
                candidates = []
        for t in candidates:
            for index, subject_filter in enumerate(self.group[t][2]):
                if subject_matches(subject_filter, subject):
                    return t, index
        if self.unknown is not None:
            return self.unknown, 0
        self.skipped["unroutable"] = self.skipped.get("unroutable", 0) + 1
        return None

    def route(self, batch: Sequence[Sequence[Any]]) -> dict[tuple[int, int], list]:
        """``{(target, filter index): [messages in stream order]}`` of one fetched batch; skipped
        messages are counted in :attr:`skipped` (``{reason: count}``)."""
        out: dict[tuple[int, int], list] = {}
        for msg in batch:
            place = self._place(msg[1])
            if place is not None:
                out.setdefault(place, []).append(msg)
            elif self.unrouted:
                self.skipped[ledger.SKIP_OWNED] = self.skipped.get(ledger.SKIP_OWNED, 0) + 1
        return out
