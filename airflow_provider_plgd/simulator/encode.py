"""Logical records (``records.py``) -> protobuf messages -> NATS payload bytes.

The bytes come from the plgd codec (``codec.encode_resource_aggregate_event`` /
``codec.encode_identity_store_event``), the one home of the wire format (docs/wire-format.md §2).
This module only fills the protobuf messages of §3.2-§3.4 from the records.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..plgd import codec
from ..plgd.pb import identitystore_pb2 as ispb
from ..plgd.pb import resourceaggregate_pb2 as pb
from .records import Content, IsEvent, Link, Meta, RaEvent

__all__ = ["encode_record", "to_message"]


def _em(m: Meta) -> pb.EventMetadata:
    return pb.EventMetadata(
        version=m.version,
        timestamp=m.timestamp,
        connection_id=m.connection_id,
        sequence=m.sequence,
        hub_id=m.hub_id,
    )


def _ac(m: Meta) -> pb.AuditContext:
    return pb.AuditContext(user_id=m.user_id, correlation_id=m.correlation_id, owner=m.owner)


def _content(c: Content) -> pb.Content:
    return pb.Content(data=c.data, content_type=c.content_type, coap_content_format=c.coap_content_format)


def _rid(r: RaEvent) -> pb.ResourceId:
    return pb.ResourceId(device_id=r.device_id, href=r.href)


def _link(link: Link) -> pb.Resource:
    return pb.Resource(
        href=link.href,
        device_id=link.device_id,
        resource_types=link.resource_types,
        interfaces=link.interfaces,
        anchor=link.anchor,
        title=link.title,
        supported_content_types=link.supported_content_types,
        valid_until=link.valid_until,
        policy=pb.Policy(bit_flags=link.bit_flags),
        endpoint_informations=[pb.EndpointInformation(endpoint=e, priority=p) for e, p in link.endpoints],
    )


def _resource_changed(r: RaEvent) -> pb.ResourceChanged:
    f = r.fields
    return pb.ResourceChanged(
        resource_id=_rid(r),
        content=_content(f["content"]),
        status=f["status"],
        audit_context=_ac(r.meta),
        event_metadata=_em(r.meta),
        etag=f["etag"],
        resource_types=f["types"],
    )


def _update_pending(r: RaEvent) -> pb.ResourceUpdatePending:
    f = r.fields
    return pb.ResourceUpdatePending(
        resource_id=_rid(r),
        resource_interface=f["interface"],
        content=_content(f["content"]),
        audit_context=_ac(r.meta),
        event_metadata=_em(r.meta),
        valid_until=f["valid_until"],
        resource_types=f["types"],
    )


def _retrieve_pending(r: RaEvent) -> pb.ResourceRetrievePending:
    f = r.fields
    return pb.ResourceRetrievePending(
        resource_id=_rid(r),
        resource_interface=f["interface"],
        audit_context=_ac(r.meta),
        event_metadata=_em(r.meta),
        valid_until=f["valid_until"],
        etag=f["etags"],
        resource_types=f["types"],
    )


def _delete_pending(r: RaEvent) -> pb.ResourceDeletePending:
    f = r.fields
    return pb.ResourceDeletePending(
        resource_id=_rid(r),
        audit_context=_ac(r.meta),
        event_metadata=_em(r.meta),
        valid_until=f["valid_until"],
        resource_interface=f["interface"],
        resource_types=f["types"],
    )


def _create_pending(r: RaEvent) -> pb.ResourceCreatePending:
    f = r.fields
    return pb.ResourceCreatePending(
        resource_id=_rid(r),
        content=_content(f["content"]),
        audit_context=_ac(r.meta),
        event_metadata=_em(r.meta),
        valid_until=f["valid_until"],
        resource_types=f["types"],
    )


def _confirmation(cls) -> Callable[[RaEvent], object]:
    def build(r: RaEvent):
        f = r.fields
        return cls(
            resource_id=_rid(r),
            status=f["status"],
            content=_content(f["content"]),
            audit_context=_ac(r.meta),
            event_metadata=_em(r.meta),
            resource_types=f["types"],
        )

    return build


def _retrieved(r: RaEvent) -> pb.ResourceRetrieved:
    f = r.fields
    return pb.ResourceRetrieved(
        resource_id=_rid(r),
        status=f["status"],
        content=_content(f["content"]),
        audit_context=_ac(r.meta),
        event_metadata=_em(r.meta),
        etag=f["etag"],
        resource_types=f["types"],
    )


def _resource_snapshot(r: RaEvent) -> pb.ResourceStateSnapshotTaken:
    f = r.fields
    p = f["pendings"]
    latest = f["latest"]
    return pb.ResourceStateSnapshotTaken(
        resource_id=_rid(r),
        latest_resource_change=_resource_changed(latest) if latest is not None else None,
        resource_create_pendings=[_create_pending(x) for x in p["create"]],
        resource_retrieve_pendings=[_retrieve_pending(x) for x in p["retrieve"]],
        resource_update_pendings=[_update_pending(x) for x in p["update"]],
        resource_delete_pendings=[_delete_pending(x) for x in p["delete"]],
        audit_context=_ac(r.meta),
        event_metadata=_em(r.meta),
        resource_types=f["types"],
    )


def _links_published(r: RaEvent) -> pb.ResourceLinksPublished:
    return pb.ResourceLinksPublished(
        device_id=r.device_id,
        resources=[_link(x) for x in r.fields["links"]],
        audit_context=_ac(r.meta),
        event_metadata=_em(r.meta),
    )


def _links_unpublished(r: RaEvent) -> pb.ResourceLinksUnpublished:
    return pb.ResourceLinksUnpublished(
        device_id=r.device_id,
        hrefs=r.fields["hrefs"],
        audit_context=_ac(r.meta),
        event_metadata=_em(r.meta),
    )


def _links_snapshot(r: RaEvent) -> pb.ResourceLinksSnapshotTaken:
    return pb.ResourceLinksSnapshotTaken(
        device_id=r.device_id,
        resources={href: _link(x) for href, x in r.fields["links"].items()},
        event_metadata=_em(r.meta),
        audit_context=_ac(r.meta),
    )


def _metadata_updated(r: RaEvent) -> pb.DeviceMetadataUpdated:
    f = r.fields
    c = f["connection"]
    t = f["twin"]
    return pb.DeviceMetadataUpdated(
        device_id=r.device_id,
        connection=pb.Connection(
            status=c.status,
            id=c.id,
            connected_at=c.connected_at,
            protocol=c.protocol,
            service_id=c.service_id,
            local_endpoints=c.local_endpoints,
        ),
        audit_context=_ac(r.meta),
        event_metadata=_em(r.meta),
        canceled=f["canceled"],
        twin_synchronization=pb.TwinSynchronization(
            state=t.state,
            syncing_at=t.syncing_at,
            in_sync_at=t.in_sync_at,
            command_metadata=pb.CommandMetadata(connection_id=t.cm_connection_id, sequence=t.cm_sequence),
            force_synchronization_at=t.force_synchronization_at,
        ),
        twin_enabled=f["twin_enabled"],
    )


def _metadata_pending(r: RaEvent) -> pb.DeviceMetadataUpdatePending:
    f = r.fields
    msg = pb.DeviceMetadataUpdatePending(
        device_id=r.device_id,
        audit_context=_ac(r.meta),
        event_metadata=_em(r.meta),
        valid_until=f["valid_until"],
    )
    if f["twin_enabled"] is not None:
        msg.twin_enabled = f["twin_enabled"]
    else:
        msg.twin_force_synchronization = f["twin_force_synchronization"]
    return msg


def _metadata_snapshot(r: RaEvent) -> pb.DeviceMetadataSnapshotTaken:
    f = r.fields
    updated = f["updated"]
    return pb.DeviceMetadataSnapshotTaken(
        device_id=r.device_id,
        device_metadata_updated=_metadata_updated(updated) if updated is not None else None,
        update_pendings=[_metadata_pending(x) for x in f["pendings"]],
        event_metadata=_em(r.meta),
    )


_BUILDERS: dict[str, Callable[[RaEvent], object]] = {
    "resourcechanged": _resource_changed,
    "resourceupdatepending": _update_pending,
    "resourceupdated": _confirmation(pb.ResourceUpdated),
    "resourceretrievepending": _retrieve_pending,
    "resourceretrieved": _retrieved,
    "resourcedeletepending": _delete_pending,
    "resourcedeleted": _confirmation(pb.ResourceDeleted),
    "resourcecreatepending": _create_pending,
    "resourcecreated": _confirmation(pb.ResourceCreated),
    "resourcestatesnapshottaken": _resource_snapshot,
    "resourcelinkspublished": _links_published,
    "resourcelinksunpublished": _links_unpublished,
    "resourcelinkssnapshottaken": _links_snapshot,
    "devicemetadataupdated": _metadata_updated,
    "devicemetadataupdatepending": _metadata_pending,
    "devicemetadatasnapshottaken": _metadata_snapshot,
}


def to_message(record: RaEvent | IsEvent):
    """The inner protobuf message of a record (``resourceaggregate.pb.*`` or
    ``identitystore.pb.DevicesRegistered``/``DevicesUnregistered``). Raises ValueError for an
    event type the simulator does not produce."""
    if isinstance(record, IsEvent):
        cls = ispb.DevicesRegistered if record.event_type == "devicesregistered" else ispb.DevicesUnregistered
        return cls(
            owner=record.owner,
            device_ids=record.device_ids,
            timestamp=record.timestamp,
            audit_context=ispb.AuditContext(user_id=record.user_id),
            event_metadata=ispb.EventMetadata(hub_id=record.hub_id),
        )
    try:
        build = _BUILDERS[record.event_type]
    except KeyError:
        raise ValueError(f"the simulator cannot encode event type {record.event_type!r}") from None
    return build(record)


# ---- fast path: the two most frequent types reuse one message per aggregate -------------------
# Overwriting every field of a cached nested protobuf message is cheaper than building one from
# scratch (figures: docs/performance.md, "Measurements behind design choices", M16). Every field is
# assigned on each use, and sub-messages are always present, so the bytes are identical to
# ``to_message`` (checked in tests/unit/simulator/test_simulator.py).

_TEMPLATE_LIMIT = 100_000
_templates: dict[tuple[str, str, str | None], Any] = {}


def _template(record: RaEvent, build: Callable[[], Any]) -> Any:
    key = (record.event_type, record.device_id, record.href)
    msg = _templates.get(key)
    if msg is None:
        if len(_templates) >= _TEMPLATE_LIMIT:
            _templates.clear()
        msg = _templates[key] = build()
    return msg


def _set_meta(msg, m: Meta) -> None:
    ac = msg.audit_context
    ac.user_id = m.user_id
    ac.correlation_id = m.correlation_id
    ac.owner = m.owner
    em = msg.event_metadata
    em.version = m.version
    em.timestamp = m.timestamp
    em.connection_id = m.connection_id
    em.sequence = m.sequence
    em.hub_id = m.hub_id


def _fast_resource_changed(r: RaEvent) -> pb.ResourceChanged:
    f = r.fields
    msg = _template(r, lambda: pb.ResourceChanged(resource_id=_rid(r)))
    if tuple(msg.resource_types) != f["types"]:
        del msg.resource_types[:]
        msg.resource_types.extend(f["types"])
    c = f["content"]
    mc = msg.content
    mc.data = c.data
    mc.content_type = c.content_type
    mc.coap_content_format = c.coap_content_format
    msg.status = f["status"]
    msg.etag = f["etag"]
    _set_meta(msg, r.meta)
    return msg


def _fast_metadata_updated(r: RaEvent) -> pb.DeviceMetadataUpdated:
    f = r.fields
    msg = _template(r, lambda: pb.DeviceMetadataUpdated(device_id=r.device_id))
    c = f["connection"]
    mc = msg.connection
    mc.status = c.status
    mc.id = c.id
    mc.connected_at = c.connected_at
    mc.protocol = c.protocol
    mc.service_id = c.service_id
    if tuple(mc.local_endpoints) != c.local_endpoints:
        del mc.local_endpoints[:]
        mc.local_endpoints.extend(c.local_endpoints)
    t = f["twin"]
    mt = msg.twin_synchronization
    mt.state = t.state
    mt.syncing_at = t.syncing_at
    mt.in_sync_at = t.in_sync_at
    cm = mt.command_metadata
    cm.connection_id = t.cm_connection_id
    cm.sequence = t.cm_sequence
    mt.force_synchronization_at = t.force_synchronization_at
    msg.canceled = f["canceled"]
    msg.twin_enabled = f["twin_enabled"]
    _set_meta(msg, r.meta)
    return msg


_FAST: dict[str, Callable[[RaEvent], object]] = {
    "resourcechanged": _fast_resource_changed,
    "devicemetadataupdated": _fast_metadata_updated,
}
_ENCODE_BUILDERS = {**_BUILDERS, **_FAST}


def encode_record(record: RaEvent | IsEvent) -> bytes:
    """The NATS payload of a record, exactly as plgd publishes it (docs/wire-format.md §2)."""
    if isinstance(record, IsEvent):
        return codec.encode_identity_store_event(to_message(record))
    return codec.encode_resource_aggregate_event(record.event_type, _ENCODE_BUILDERS[record.event_type](record))
