"""Logical plgd events: what the simulated hub did, as plain Python values.

The hub model (``model.py``) produces these records; ``encode.py`` turns each one into the exact
wire bytes (through the plgd codec), and ``state.py`` folds the published ones into the expected
snapshot tables. Neither side looks at the other's output, so the expected state never comes
from decoding bytes.

Field names follow the protobuf messages of docs/wire-format.md §3.2-§3.4. Times are unix ns.
Records are treated as immutable once emitted (snapshot records share them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["EMPTY_CONTENT", "Connection", "Content", "IsEvent", "Link", "Meta", "RaEvent", "TwinSync"]


@dataclass(slots=True)
class Meta:
    """``event_metadata`` + ``audit_context`` of a resource-aggregate event (§3.2, §3.3)."""

    version: int
    timestamp: int
    connection_id: str
    sequence: int
    user_id: str
    correlation_id: str
    owner: str  # raw owner claim (pre-hash)
    hub_id: str


@dataclass(slots=True)
class Content:
    """``resourceaggregate.pb.Content``: ``coap_content_format`` -1 = not provided."""

    data: bytes
    content_type: str
    coap_content_format: int


#: Content of the RA's NOT_FOUND reset after an unpublish, and of empty confirmations (§4.4).
EMPTY_CONTENT = Content(b"", "", -1)


@dataclass(slots=True)
class Link:
    """``resourceaggregate.pb.Resource`` (one published link). ``endpoints``: (endpoint, priority)."""

    href: str
    device_id: str
    resource_types: tuple[str, ...]
    interfaces: tuple[str, ...]
    anchor: str
    title: str
    supported_content_types: tuple[str, ...]
    valid_until: int
    bit_flags: int
    endpoints: tuple[tuple[str, int], ...]


@dataclass(slots=True)
class Connection:
    """``Connection``: ``status`` 0 OFFLINE / 1 ONLINE; ``protocol`` enum value (4 = COAPS_TCP)."""

    status: int
    id: str
    connected_at: int
    protocol: int
    service_id: str
    local_endpoints: tuple[str, ...]


@dataclass(slots=True)
class TwinSync:
    """``TwinSynchronization``: ``state`` 0 OUT_OF_SYNC, 1 DISABLED, 2 SYNCING, 3 IN_SYNC."""

    state: int
    syncing_at: int
    in_sync_at: int
    cm_connection_id: str
    cm_sequence: int
    force_synchronization_at: int


@dataclass(slots=True)
class RaEvent:
    """One resource-aggregate event.

    :ivar event_type: §3.1 string.
    :ivar owner_id: subject owner token (hashed owner).
    :ivar device_id: group ID.
    :ivar href: resource href for resource events; None for links and metadata events.
    :ivar meta: event metadata and audit context.
    :ivar fields: type-specific values:

        ===============================  ===========================================================
        resourcechanged                  content, status (int), etag (bytes), types
        resourceupdatepending            content, interface, valid_until, types
        resourceretrievepending          interface, valid_until, etags (tuple of bytes), types
        resourcedeletepending            interface, valid_until, types
        resourcecreatepending            content, valid_until, types
        resourceupdated/created/deleted  status, content, types
        resourceretrieved                status, content, etag, types
        resourcestatesnapshottaken       latest (RaEvent or None), pendings ({kind: tuple}), types
        resourcelinkspublished           links (tuple of Link)
        resourcelinksunpublished         hrefs (tuple of str)
        resourcelinkssnapshottaken       links ({href: Link})
        devicemetadataupdated            connection, twin (TwinSync), twin_enabled, canceled
        devicemetadataupdatepending      twin_enabled (bool or None), twin_force_synchronization
                                         (bool or None), valid_until
        devicemetadatasnapshottaken      updated (RaEvent or None), pendings (tuple of RaEvent)
        ===============================  ===========================================================
    """

    event_type: str
    owner_id: str
    device_id: str
    href: str | None
    meta: Meta
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class IsEvent:
    """One identity-store event (``devicesregistered`` / ``devicesunregistered``, §3.4)."""

    event_type: str
    owner_id: str
    owner: str
    device_ids: tuple[str, ...]
    timestamp: int
    user_id: str
    hub_id: str
