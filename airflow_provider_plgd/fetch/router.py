"""Routing fetched messages to their (owner, event type) batches and filters, on the client.

The server walks the stream once per consumer, so one consumer per range of the interval
(:class:`RangeRouter`, the ETL) or per owner (:class:`Router`, the operator's ``owner_ids``) beats
one consumer per (owner, event type, filter) by far (docs/performance.md, "Measurements behind
design choices", M17). Routing gives each batch the same rows as its own consumers would.
"""

from __future__ import annotations

from collections.abc import Sequence

from airflow_provider_plgd.fetch.selection import Target, unrouted_targets
from airflow_provider_plgd.jetstream.messages import StreamMessage
from airflow_provider_plgd.plgd.event_types import EVENT_TYPES
from airflow_provider_plgd.plgd.subjects import (
    TOKEN_OWNERS,
    TOKEN_PLGD,
    parse_subject,
    subject_filters,
    subject_matches,
    subject_owner,
    validate_owner_id,
)
from airflow_provider_plgd.tables import ledger


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

    def __init__(self, group: Sequence[Target], *, unrouted: bool = False) -> None:
        self.group = group
        self.unrouted = unrouted
        self.by_type: dict[str | None, int] = {t.event_type: i for i, t in enumerate(group)}
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
                filters = self.group[target].filters
                if len(filters) == 1:
                    return target, 0
                candidates = [target]
            elif event_type in self.known_types:
                self.skipped[ledger.SKIP_NOT_REQUESTED] = self.skipped.get(ledger.SKIP_NOT_REQUESTED, 0) + 1
                return None
            else:
                candidates = []
        for t in candidates:
            for index, subject_filter in enumerate(self.group[t].filters):
                if subject_matches(subject_filter, subject):
                    return t, index
        if self.unknown is not None:
            return self.unknown, 0
        self.skipped["unroutable"] = self.skipped.get("unroutable", 0) + 1
        return None

    def route(self, batch: Sequence[StreamMessage]) -> dict[tuple[int, int], list[StreamMessage]]:
        """``{(target, filter index): [messages in stream order]}`` of one fetched batch; skipped
        messages are counted in :attr:`skipped` (``{reason: count}``)."""
        out: dict[tuple[int, int], list[StreamMessage]] = {}
        for msg in batch:
            place = self._place(msg.subject)
            if place is not None:
                out.setdefault(place, []).append(msg)
            elif self.unrouted:
                self.skipped[ledger.SKIP_OWNED] = self.skipped.get(ledger.SKIP_OWNED, 0) + 1
        return out


class RangeRouter:
    """Routes the messages of one stream-sequence range (every owner) to their (owner, event type) batch.

    The owner is the subject's owner token when it is a valid owner ID
    (``plgd.subjects.subject_owner``), else ``ledger.UNROUTED_OWNER``. Within an owner, ONE
    :class:`Router` shared by every owner places the message: its targets are the requested event
    types and ``_unknown`` with the owner token a wildcard (``subject_filters("*", …)``), which
    match exactly the subjects the owner's own filters match, since the owner token is the owner.
    So nothing is built per owner: the cost follows the messages. Skipped messages are counted
    (:attr:`skipped`): known event types not requested, and with a selection of owners a message
    of another owner (the consumer's filters make that impossible; counted, not dropped, if a
    server ever sends one).

    :param event_types: the requested event types (checked). :param owners: the selected owners,
        or None for every owner (then messages without a valid owner go to ``_unrouted``).
    """

    def __init__(self, event_types: Sequence[str], owners: Sequence[str] | None = None) -> None:
        self.event_types = tuple(event_types)
        self.owners = None if owners is None else frozenset(owners)
        self.targets = [Target("*", e, subject_filters("*", e)) for e in self.event_types] + [
            Target("*", ledger.UNKNOWN_EVENT_TYPE, subject_filters("*"))]
        self.owned = Router(self.targets)
        self.unrouted = Router(unrouted_targets(), unrouted=True)
        self._owner_of_token: dict[str, str] = {}
        self._skipped: dict[str, int] = {}

    def owner_of(self, subject: str) -> str:
        """The batch owner of a subject: its valid owner ID, else ``ledger.UNROUTED_OWNER``."""
        tokens = subject.split(".", 3)
        if len(tokens) < 4 or tokens[0] != TOKEN_PLGD or tokens[1] != TOKEN_OWNERS:
            return ledger.UNROUTED_OWNER
        token = tokens[2]
        owner = self._owner_of_token.get(token)
        if owner is None:
            try:
                owner = validate_owner_id(token)
            except (TypeError, ValueError):
                owner = ledger.UNROUTED_OWNER
            if len(self._owner_of_token) < OWNER_CACHE:
                self._owner_of_token[token] = owner
        return owner

    def route(self, batch: Sequence[StreamMessage]) -> dict[tuple[str, str], list[StreamMessage]]:
        """``{(owner, event type): [messages in stream order]}`` of one fetched batch."""
        by_owner: dict[str, list[StreamMessage]] = {}
        for msg in batch:
            by_owner.setdefault(self.owner_of(msg.subject), []).append(msg)
        out: dict[tuple[str, str], list[StreamMessage]] = {}
        for owner, msgs in by_owner.items():
            if self.owners is not None and owner not in self.owners:
                self._skipped[ledger.SKIP_OWNER_NOT_REQUESTED] = (
                    self._skipped.get(ledger.SKIP_OWNER_NOT_REQUESTED, 0) + len(msgs))
                continue
            router = self.unrouted if owner == ledger.UNROUTED_OWNER else self.owned
            for (target, _), rows in router.route(msgs).items():
                out.setdefault((owner, router.group[target].event_type), []).extend(rows)
        return out

    @property
    def skipped(self) -> dict[str, int]:
        """``{reason: count}`` over every owner."""
        total = dict(self._skipped)
        for router in (self.owned, self.unrouted):
            for reason, n in router.skipped.items():
                total[reason] = total.get(reason, 0) + n
        return dict(sorted(total.items()))


#: Owner tokens whose check :meth:`RangeRouter.owner_of` remembers (bounds its memory at any fleet size).
OWNER_CACHE = 65_536
