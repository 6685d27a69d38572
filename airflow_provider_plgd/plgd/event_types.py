"""The one table of plgd event types (docs/wire-format.md §3.1, plgd hub v2.25.0).

Each event type string (exactly as in the envelope's ``event_type`` and in the subject) maps to
its protobuf message, its subject family and its aggregate kind.

* ``EVENT_TYPES``: the types that can appear on NATS: the resource-aggregate and identity-store
  types published by hub v2.16.0+ (``live``; 13 + 2), and the ``*snapshottaken`` types
  published only by hubs older than v2.16.0 (``snapshot``; 3): 18 in all. These counts are
  stated here only; code, tests and docs derive them from the table below.
* ``SERVICE_METADATA_EVENT_TYPES``: ``ServiceMetadataUpdated`` / ``ServiceMetadataSnapshotTaken``
  (CamelCase in plgd). They have no subject and are **never** published on NATS; they are kept
  here only so their message classes have a home. They are not in ``EVENT_TYPES``, not in
  ``LIVE_EVENT_TYPES``, and ``event_type_info``/``message_class`` reject them.

The family is the subject token that selects the subject template (docs/wire-format.md §1.1):
``registrations`` (S1), ``resource-links`` (S2), ``metadata`` (S3), ``resources`` (S4-S6).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from google.protobuf.message import Message

from .pb import identitystore_pb2, resourceaggregate_pb2

__all__ = [
    "AGGREGATE_LINKS",
    "AGGREGATE_METADATA",
    "AGGREGATE_RESOURCE",
    "EVENT_TYPES",
    "EVENT_TYPES_BY_FAMILY",
    "FAMILIES",
    "FAMILY_METADATA",
    "FAMILY_REGISTRATIONS",
    "FAMILY_RESOURCES",
    "FAMILY_RESOURCE_LINKS",
    "IDENTITY_STORE_EVENT_TYPE_TO_ONEOF",
    "IDENTITY_STORE_ONEOF_TO_EVENT_TYPE",
    "LIVE_EVENT_TYPES",
    "SERVICE_METADATA_EVENT_TYPES",
    "SNAPSHOT_EVENT_TYPES",
    "EventTypeInfo",
    "event_type_for_message",
    "event_type_info",
    "message_class",
]

# Subject families. Each value is also the literal subject token (docs/wire-format.md §1.1); this is
# the one home of these four literals, ``subjects.py`` imports them.
FAMILY_REGISTRATIONS = "registrations"
FAMILY_RESOURCE_LINKS = "resource-links"
FAMILY_METADATA = "metadata"
FAMILY_RESOURCES = "resources"
FAMILIES = (FAMILY_REGISTRATIONS, FAMILY_RESOURCE_LINKS, FAMILY_METADATA, FAMILY_RESOURCES)

# Aggregate kinds (docs/wire-format.md §4.1); identity-store events have none (None).
AGGREGATE_RESOURCE = "resource"
AGGREGATE_LINKS = "links"
AGGREGATE_METADATA = "metadata"


@dataclass(frozen=True, slots=True)
class EventTypeInfo:
    """One row of docs/wire-format.md §3.1.

    :ivar name: event type string, e.g. ``"resourcechanged"``.
    :ivar message_name: protobuf message name, e.g. ``"ResourceChanged"`` (package
        ``resourceaggregate.pb``, or ``identitystore.pb`` for the registrations family).
    :ivar family: ``"registrations"`` | ``"resource-links"`` | ``"metadata"`` | ``"resources"``
        (for the never-published service-metadata types: ``"service-metadata"``).
    :ivar aggregate: ``"resource"`` | ``"links"`` | ``"metadata"`` | None (identity-store; and
        ``"service-metadata"`` for the never-published types).
    :ivar live: published by hub v2.16.0+.
    :ivar snapshot: a ``*snapshottaken`` full-state event (published only by hubs < v2.16.0).
    :ivar on_nats: False only for the two service-metadata types, which have no subject.
    """

    name: str
    message_name: str
    family: str
    aggregate: str | None
    live: bool
    snapshot: bool
    on_nats: bool = True

    @property
    def message_class(self) -> type[Message]:
        """The generated protobuf class (``resourceaggregate_pb2``/``identitystore_pb2``)."""
        return _CLASSES[self.name]


def _ra(name: str, message_name: str, family: str, aggregate: str, *, snapshot: bool = False):
    return EventTypeInfo(name, message_name, family, aggregate, live=not snapshot, snapshot=snapshot)


_ROWS = (
    # resource-links aggregate, subject S2
    _ra("resourcelinkspublished", "ResourceLinksPublished", FAMILY_RESOURCE_LINKS, AGGREGATE_LINKS),
    _ra("resourcelinksunpublished", "ResourceLinksUnpublished", FAMILY_RESOURCE_LINKS, AGGREGATE_LINKS),
    _ra(
        "resourcelinkssnapshottaken",
        "ResourceLinksSnapshotTaken",
        FAMILY_RESOURCE_LINKS,
        AGGREGATE_LINKS,
        snapshot=True,
    ),
    # device-metadata aggregate, subject S3
    _ra("devicemetadataupdatepending", "DeviceMetadataUpdatePending", FAMILY_METADATA, AGGREGATE_METADATA),
    _ra("devicemetadataupdated", "DeviceMetadataUpdated", FAMILY_METADATA, AGGREGATE_METADATA),
    _ra(
        "devicemetadatasnapshottaken",
        "DeviceMetadataSnapshotTaken",
        FAMILY_METADATA,
        AGGREGATE_METADATA,
        snapshot=True,
    ),
    # resource-state aggregate, subjects S4/S5/S6
    _ra("resourcechanged", "ResourceChanged", FAMILY_RESOURCES, AGGREGATE_RESOURCE),
    _ra("resourceupdatepending", "ResourceUpdatePending", FAMILY_RESOURCES, AGGREGATE_RESOURCE),
    _ra("resourceupdated", "ResourceUpdated", FAMILY_RESOURCES, AGGREGATE_RESOURCE),
    _ra("resourceretrievepending", "ResourceRetrievePending", FAMILY_RESOURCES, AGGREGATE_RESOURCE),
    _ra("resourceretrieved", "ResourceRetrieved", FAMILY_RESOURCES, AGGREGATE_RESOURCE),
    _ra("resourcedeletepending", "ResourceDeletePending", FAMILY_RESOURCES, AGGREGATE_RESOURCE),
    _ra("resourcedeleted", "ResourceDeleted", FAMILY_RESOURCES, AGGREGATE_RESOURCE),
    _ra("resourcecreatepending", "ResourceCreatePending", FAMILY_RESOURCES, AGGREGATE_RESOURCE),
    _ra("resourcecreated", "ResourceCreated", FAMILY_RESOURCES, AGGREGATE_RESOURCE),
    _ra(
        "resourcestatesnapshottaken",
        "ResourceStateSnapshotTaken",
        FAMILY_RESOURCES,
        AGGREGATE_RESOURCE,
        snapshot=True,
    ),
    # identity-store, subject S1; payload identitystore.pb.Event with a oneof
    EventTypeInfo("devicesregistered", "DevicesRegistered", FAMILY_REGISTRATIONS, None, live=True, snapshot=False),
    EventTypeInfo("devicesunregistered", "DevicesUnregistered", FAMILY_REGISTRATIONS, None, live=True, snapshot=False),
)

_SERVICE_ROWS = (
    EventTypeInfo(
        "ServiceMetadataUpdated",
        "ServiceMetadataUpdated",
        "service-metadata",
        "service-metadata",
        live=False,
        snapshot=False,
        on_nats=False,
    ),
    EventTypeInfo(
        "ServiceMetadataSnapshotTaken",
        "ServiceMetadataSnapshotTaken",
        "service-metadata",
        "service-metadata",
        live=False,
        snapshot=True,
        on_nats=False,
    ),
)

#: All event types that can appear on NATS (live + ``*snapshottaken``), by name.
EVENT_TYPES: Mapping[str, EventTypeInfo] = MappingProxyType({row.name: row for row in _ROWS})
#: Event types published by hub v2.16.0+ (resource-aggregate + identity-store), table order.
LIVE_EVENT_TYPES: tuple[str, ...] = tuple(row.name for row in _ROWS if row.live)
#: The ``*snapshottaken`` types (hubs < v2.16.0 only).
SNAPSHOT_EVENT_TYPES: tuple[str, ...] = tuple(row.name for row in _ROWS if row.snapshot)
#: Event types per family, table order.
EVENT_TYPES_BY_FAMILY: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {family: tuple(row.name for row in _ROWS if row.family == family) for family in FAMILIES}
)
#: Never published on NATS (no subject); not part of EVENT_TYPES.
SERVICE_METADATA_EVENT_TYPES: Mapping[str, EventTypeInfo] = MappingProxyType(
    {row.name: row for row in _SERVICE_ROWS}
)

#: ``identitystore.pb.Event`` oneof ``type`` member name -> event type (docs/wire-format.md §3.4).
IDENTITY_STORE_ONEOF_TO_EVENT_TYPE: Mapping[str, str] = MappingProxyType(
    {"devices_registered": "devicesregistered", "devices_unregistered": "devicesunregistered"}
)
#: Event type -> ``identitystore.pb.Event`` oneof member name.
IDENTITY_STORE_EVENT_TYPE_TO_ONEOF: Mapping[str, str] = MappingProxyType(
    {v: k for k, v in IDENTITY_STORE_ONEOF_TO_EVENT_TYPE.items()}
)


def _build_classes() -> dict[str, type[Message]]:
    classes: dict[str, type[Message]] = {}
    for row in (*_ROWS, *_SERVICE_ROWS):
        module = identitystore_pb2 if row.family == FAMILY_REGISTRATIONS else resourceaggregate_pb2
        classes[row.name] = getattr(module, row.message_name)
    return classes


# Resolved once at import; lookups are a dict access.
_CLASSES: dict[str, type[Message]] = _build_classes()


def event_type_info(name: str) -> EventTypeInfo:
    """Return the §3.1 row of event type ``name`` (exact, case-sensitive).

    Raises ValueError naming the value if ``name`` is not one of ``EVENT_TYPES`` (this includes
    the service-metadata types, which are never on NATS).
    """
    try:
        return EVENT_TYPES[name]
    except (KeyError, TypeError):
        pass
    if isinstance(name, str) and name in SERVICE_METADATA_EVENT_TYPES:
        raise ValueError(
            f"event type {name!r} is never published on NATS (no subject; docs/wire-format.md §3.1)"
        )
    raise ValueError(
        f"unknown plgd event type {name!r}; expected one of: {', '.join(EVENT_TYPES)}"
    )


def message_class(name: str) -> type[Message]:
    """Return the protobuf class of the inner message of event type ``name``.

    Resource-aggregate types -> ``resourceaggregate_pb2.<MessageName>``; ``devicesregistered`` /
    ``devicesunregistered`` -> ``identitystore_pb2.DevicesRegistered`` / ``DevicesUnregistered``
    (the member of the ``identitystore.pb.Event`` oneof, not the ``Event`` wrapper).
    Raises ValueError naming the value for anything not in ``EVENT_TYPES``.
    """
    return _CLASSES[event_type_info(name).name]


_TYPES_BY_CLASS: dict[type[Message], str] = {
    cls: name for name, cls in _CLASSES.items() if name in EVENT_TYPES
}


def event_type_for_message(message: Message) -> str:
    """Return the event type string of an inner event message (inverse of ``message_class``).

    Example: a ``resourceaggregate_pb2.ResourceChanged`` -> ``"resourcechanged"``; an
    ``identitystore_pb2.DevicesRegistered`` -> ``"devicesregistered"``.
    Raises TypeError naming the type if ``message`` is not the message of any ``EVENT_TYPES``
    entry (the service-metadata messages are never on NATS and are rejected too).
    """
    try:
        return _TYPES_BY_CLASS[type(message)]
    except (KeyError, TypeError):
        raise TypeError(
            f"{type(message).__name__} is not the message of a plgd event type on NATS; expected "
            "one of: " + ", ".join(sorted(info.message_name for info in EVENT_TYPES.values()))
        ) from None
