"""What one fetch reads: owners and event types, validated once where they enter.

The fetch operator builds a :class:`Selection` in ``execute`` from its arguments (or the ledger's
plan), the ETL DAG's ``plan`` from its params; everything downstream takes it as given. Two checks
stay elsewhere: staging's path-safety check (``staging.validate_partition_value``), which guards
every path it builds whoever calls it, and the stream name (``jetstream.connection.check_stream_name``),
checked by the hook where the stream is resolved: without a ``stream`` argument it comes from the
Airflow connection, which is read only after the arguments passed their checks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from airflow_provider_plgd.coerce import as_list
from airflow_provider_plgd.plgd.event_types import event_type_info
from airflow_provider_plgd.plgd.subjects import (
    check_filter_subject,
    owner_event_filters,
    owner_filter,
    validate_owner_id,
    validate_token,
)
from airflow_provider_plgd.tables import ledger, staging


class Target(NamedTuple):
    """One batch to fetch: its ``owner_id`` and ``event_type`` partition values and its subject filters."""

    owner: str
    event_type: str
    filters: list[str]


def _event_type(value: object) -> str:
    return event_type_info(validate_token(value, "event_type")).name  # ValueError naming the value when unknown


@dataclass(frozen=True)
class Selection:
    """Owner IDs and event types, each checked once (:meth:`of`).

    :ivar owners: owner IDs (``plgd.subjects.validate_owner_id``); empty: not chosen yet.
    :ivar event_types: known plgd event types (``plgd.event_types.EVENT_TYPES``).
    """

    owners: tuple[str, ...]
    event_types: tuple[str, ...]

    @classmethod
    def of(cls, owners: Iterable[str], event_types: Iterable[str]) -> Selection:
        """Check and build.

        :raises ValueError: (naming the field and the value) an invalid owner ID token or event type
            token, or an unknown event type. :raises TypeError: a non-str owner ID.
        """
        return cls(tuple(validate_owner_id(o) for o in owners), tuple(_event_type(e) for e in event_types))

    def with_owners(self, owners: Iterable[str]) -> Selection:
        """The same selection for ``owners`` (e.g. those the stream holds), checked like in :meth:`of`."""
        return Selection(tuple(validate_owner_id(o) for o in owners), self.event_types)

    def targets(self, *, owner_wide: bool) -> list[Target]:
        """One target per (owner, event type), owners first; ``owner_wide`` adds each owner's
        ``ledger.UNKNOWN_EVENT_TYPE`` batch (messages of event types we do not know)."""
        unknown = (lambda o: [Target(o, ledger.UNKNOWN_EVENT_TYPE, [owner_filter(o)])]) if owner_wide \
            else (lambda o: [])
        return [t for o in self.owners
                for t in [Target(o, e, owner_event_filters(o, e)) for e in self.event_types] + unknown(o)]


def filter_targets(filters: list[str]) -> list[Target]:
    """The one target of arbitrary subject filters: owner ``staging.FILTER_OWNER``, event type
    ``staging.filter_key(filters)``. :raises ValueError: an invalid filter subject (names it)."""
    for f in filters:
        check_filter_subject(f, "subject_filter")
    return [Target(staging.FILTER_OWNER, staging.filter_key(filters), list(filters))]


def unrouted_targets() -> list[Target]:
    """The one target of the messages no owner's fetch reads (see ``fetch.router.Router``)."""
    return [Target(ledger.UNROUTED_OWNER, ledger.UNKNOWN_EVENT_TYPE, [ledger.SCOPE_FILTER])]


def owner_groups(targets: list[Target]) -> list[list[Target]]:
    """Group targets by owner (fetch order kept; owners in first-seen order). Targets of arbitrary
    subject filters (owner ``staging.FILTER_OWNER``) stay alone."""
    groups: dict[str, list[Target]] = {}
    alone = []
    for target in targets:
        if target.owner == staging.FILTER_OWNER:
            alone.append([target])
        else:
            groups.setdefault(target.owner, []).append(target)
    return list(groups.values()) + alone


def targets_of_arguments(*, owner_id: str | None, event_type: str | None, owner_ids: Any, event_types: Any,
                         subject_filter: str | Sequence[str] | None, unrouted: Any) -> tuple[list[Target], bool]:
    """The fetch operator's selection arguments as ``(targets in fetch order, owner_wide)``; every
    value is checked here, once (:class:`Selection`). ``owner_wide``: each owner is read through one
    consumer and accounted as a whole (``owner_ids``, ``unrouted``).

    :raises ValueError: not exactly one kind of target (``owner_id`` + ``event_type``, ``owner_ids`` +
        ``event_types``, ``subject_filter``, ``unrouted``), one of a pair missing, or a bad value
        (naming it).
    """
    single = owner_id is not None or event_type is not None
    group = owner_ids is not None or event_types is not None
    arbitrary = subject_filter not in (None, "", [])
    if single + group + arbitrary + bool(unrouted) != 1:
        raise ValueError(
            "JetStreamToStagingOperator needs exactly one target: owner_id + event_type, "
            "owner_ids + event_types, subject_filter, unrouted=True, or ledger + ledger_range "
            f"(got owner_id={owner_id!r}, event_type={event_type!r}, owner_ids={owner_ids!r}, "
            f"event_types={event_types!r}, subject_filter={subject_filter!r})"
        )
    if unrouted:
        return unrouted_targets(), True
    if arbitrary:
        return filter_targets(staging.as_filter_list(subject_filter)), False  # type: ignore[arg-type]
    if single:
        if owner_id is None or event_type is None:
            raise ValueError(
                f"owner_id and event_type must both be set (got owner_id={owner_id!r}, "
                f"event_type={event_type!r}); use subject_filter for other selections"
            )
        return Selection.of([owner_id], [event_type]).targets(owner_wide=False), False
    owners, types = as_list(owner_ids, "owner_ids"), as_list(event_types, "event_types")
    return Selection.of(owners, types).targets(owner_wide=True), True
