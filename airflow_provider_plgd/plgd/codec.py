"""Encode and decode plgd NATS payloads (docs/wire-format.md §2, plgd hub v2.25.0).

Two body formats, chosen by the subject family (§2.1):

* resource-aggregate (subjects ``plgd.owners.*.devices.>``): payload = protobuf
  ``ocf.cloud.cqrs.eventbus.v2.Event`` (envelope, **not** compressed); its ``data`` field =
  snappy **block** format (golang/snappy ``Encode``; python-snappy ``snappy.compress`` /
  ``snappy.decompress``; not the framed format) of the protobuf inner event (§2.2, §2.3).
* identity-store (subjects ``plgd.owners.*.registrations.*``): payload = snappy block of protobuf
  ``identitystore.pb.Event`` (a oneof); no envelope (§2.1, §3.4).

Every decoding failure is a :class:`PlgdDecodeError` (a ValueError) with ``.reason`` one of
``bad_snappy``, ``bad_protobuf``, ``unknown_event_type``, ``bad_subject``, ``subject_mismatch``,
``content_too_large``; no snappy (``snappy.UncompressError``), cramjam or protobuf
(``DecodeError``) exception leaves this module.

**Decode bombs.** A block that would decode to more than ``max_decoded_bytes`` (default
:data:`DEFAULT_MAX_DECODED_BYTES`, 4 MiB) is refused with reason ``content_too_large`` before
anything is decompressed (:mod:`.snappy_block`).

Classification choices (documented here, tested in ``tests/unit/plgd/test_codec.py``):

* Protobuf parsing of arbitrary bytes sometimes *succeeds* (proto3 has no required fields). An
  envelope that parses but has an **empty** ``event_type`` is ``bad_protobuf``: every plgd
  envelope carries the type, so such bytes are not an envelope (e.g. an empty payload). A
  non-empty type that is not a resource-aggregate type in ``EVENT_TYPES`` is
  ``unknown_event_type`` (maybe a newer hub; garbage can also land here).
* An identity-store payload that decompresses to zero bytes is ``bad_protobuf``; one that parses
  but sets no member of the ``type`` oneof (non-empty, e.g. a oneof member added by a newer hub)
  is ``unknown_event_type``.
* An empty or missing envelope ``data`` is ``bad_snappy`` (golang/snappy encodes even an empty
  message as one byte, so a real envelope never has empty ``data``).
* Non-bytes input (e.g. None) is ``bad_protobuf`` for resource-aggregate payloads and
  ``bad_snappy`` for identity-store payloads (it is the first layer that rejects it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import snappy
from google.protobuf.message import Message

from ..exceptions import DECODE_ERROR_REASONS, PlgdDecodeError
from .event_types import (
    AGGREGATE_LINKS,
    AGGREGATE_RESOURCE,
    EVENT_TYPES,
    FAMILY_REGISTRATIONS,
    FAMILY_RESOURCES,
    IDENTITY_STORE_EVENT_TYPE_TO_ONEOF,
    IDENTITY_STORE_ONEOF_TO_EVENT_TYPE,
    EventTypeInfo,
    event_type_for_message,
    event_type_info,
    message_class,
)
from .ids import href_id, links_aggregate_id, metadata_aggregate_id, resource_aggregate_id
from .pb import eventbus_pb2, identitystore_pb2
from .snappy_block import DEFAULT_MAX_DECODED_BYTES, decompress, short_error
from .subjects import Subject, parse_subject

__all__ = [
    "DECODE_ERROR_REASONS",
    "DEFAULT_MAX_DECODED_BYTES",
    "Decoded",
    "PlgdDecodeError",
    "decode_identity_store_payload",
    "decode_payload",
    "decode_resource_aggregate_payload",
    "encode_event",
    "encode_identity_store_event",
    "encode_resource_aggregate_event",
]



@dataclass(slots=True)
class Decoded:
    """A decoded plgd payload.

    :ivar event_type: the §3.1 event type string, e.g. ``"resourcechanged"``.
    :ivar message: the inner protobuf message (``resourceaggregate_pb2.<Type>`` or
        ``identitystore_pb2.DevicesRegistered``/``DevicesUnregistered``).
    :ivar envelope: the ``eventbus_pb2.Event`` envelope for resource-aggregate events (its
        ``data`` still holds the compressed inner bytes); None for identity-store events.
    """

    event_type: str
    message: Any
    envelope: Any = None

    @property
    def info(self) -> EventTypeInfo:
        """The §3.1 row of ``event_type``."""
        return EVENT_TYPES[self.event_type]

    @property
    def device_id(self) -> str | None:
        """Device ID from the inner message (``resource_id.device_id`` or ``device_id``); None for
        identity-store events (they carry a list, ``message.device_ids``)."""
        getter = _DEVICE_ID_OF.get(self.event_type)
        return None if getter is None else getter(self.message)

    @property
    def href(self) -> str | None:
        """``resource_id.href`` for resource events, else None."""
        if self.event_type in _RESOURCE_TYPES:
            return self.message.resource_id.href
        return None

    @property
    def aggregate_id(self) -> str | None:
        """Envelope ``aggregate_id`` (UUID text); None for identity-store events."""
        return None if self.envelope is None else self.envelope.aggregate_id

    @property
    def version(self) -> int | None:
        """Inner ``event_metadata.version`` (aggregate version); None for identity-store events."""
        return None if self.envelope is None else self.message.event_metadata.version

    @property
    def timestamp(self) -> int:
        """Event time in unix ns: inner ``event_metadata.timestamp`` (resource-aggregate) or
        ``timestamp`` (identity-store). The envelope's own ``timestamp`` is always 0 (§2.2)."""
        if self.envelope is None:
            return self.message.timestamp
        return self.message.event_metadata.timestamp


# ---- tables resolved once at import ----------------------------------------------------------

_ENVELOPE = eventbus_pb2.Event
_IS_EVENT = identitystore_pb2.Event
_RA_CLASSES: dict[str, type[Message]] = {
    name: message_class(name)
    for name, info in EVENT_TYPES.items()
    if info.family != FAMILY_REGISTRATIONS
}
_RESOURCE_TYPES = frozenset(n for n, i in EVENT_TYPES.items() if i.family == FAMILY_RESOURCES)
_IS_TYPES = frozenset(IDENTITY_STORE_EVENT_TYPE_TO_ONEOF)
_get_resource_device = attrgetter("resource_id.device_id")
_get_device = attrgetter("device_id")
_DEVICE_ID_OF: dict[str, Callable[[Any], str]] = {
    name: (_get_resource_device if name in _RESOURCE_TYPES else _get_device) for name in _RA_CLASSES
}
_AGGREGATE_OF: dict[str, str | None] = {name: EVENT_TYPES[name].aggregate for name in _RA_CLASSES}


# ---- encoding ---------------------------------------------------------------------------------


def encode_resource_aggregate_event(event_type: str, message: Message) -> bytes:
    """NATS payload of a resource-aggregate event, as the hub publishes it (docs/wire-format.md §2.2).

    Returns the serialized ``ocf.cloud.cqrs.eventbus.v2.Event`` envelope with ``version`` =
    ``message.event_metadata.version``, ``event_type``, ``group_id`` = device ID of the message,
    ``aggregate_id`` per aggregate kind (``ids.resource_aggregate_id(device, href)``,
    ``links_aggregate_id`` or ``metadata_aggregate_id``), ``data`` = ``snappy.compress`` (block
    format) of the inner message; ``is_snapshot`` false and ``timestamp`` 0 as on the wire.
    Serialization is deterministic (same message -> same bytes).

    :raises ValueError: unknown event type, an identity-store type, or an empty device ID.
    :raises TypeError: ``message`` is not ``message_class(event_type)``.
    """
    info = event_type_info(event_type)
    cls = _RA_CLASSES.get(event_type)
    if cls is None:
        raise ValueError(
            f"{event_type!r} is an identity-store event type; use encode_identity_store_event()"
        )
    if not isinstance(message, cls):
        raise TypeError(
            f"event type {event_type!r} needs a resourceaggregate.pb.{info.message_name}, "
            f"got {type(message).__name__}"
        )
    device_id = _DEVICE_ID_OF[event_type](message)
    if not device_id:
        raise ValueError(f"{info.message_name} has an empty device_id; cannot build the envelope")
    aggregate = _AGGREGATE_OF[event_type]
    if aggregate == AGGREGATE_RESOURCE:
        aggregate_id = resource_aggregate_id(device_id, message.resource_id.href)
    elif aggregate == AGGREGATE_LINKS:
        aggregate_id = links_aggregate_id(device_id)
    else:  # AGGREGATE_METADATA
        aggregate_id = metadata_aggregate_id(device_id)
    envelope = _ENVELOPE(
        version=message.event_metadata.version,
        event_type=event_type,
        group_id=device_id,
        aggregate_id=aggregate_id,
        data=snappy.compress(message.SerializeToString(deterministic=True)),
    )
    return envelope.SerializeToString(deterministic=True)


def encode_identity_store_event(
    message: identitystore_pb2.DevicesRegistered | identitystore_pb2.DevicesUnregistered,
) -> bytes:
    """NATS payload of an identity-store event: ``snappy.compress(identitystore.pb.Event)``.

    The message is put into the ``type`` oneof member (``devices_registered`` or
    ``devices_unregistered``); docs/wire-format.md §2.1, §3.4. Deterministic serialization.
    :raises TypeError: ``message`` is neither ``DevicesRegistered`` nor ``DevicesUnregistered``.
    """
    if isinstance(message, identitystore_pb2.DevicesRegistered):
        event = _IS_EVENT(devices_registered=message)
    elif isinstance(message, identitystore_pb2.DevicesUnregistered):
        event = _IS_EVENT(devices_unregistered=message)
    else:
        raise TypeError(
            "expected identitystore.pb.DevicesRegistered or DevicesUnregistered, "
            f"got {type(message).__name__}"
        )
    return snappy.compress(event.SerializeToString(deterministic=True))


def encode_event(message: Message) -> bytes:
    """Payload for any inner event message; dispatches on its class (``event_type_for_message``).

    :raises TypeError: not the message of an event type in ``EVENT_TYPES``.
    :raises ValueError: as ``encode_resource_aggregate_event``.
    """
    event_type = event_type_for_message(message)
    if event_type in _IS_TYPES:
        return encode_identity_store_event(message)
    return encode_resource_aggregate_event(event_type, message)


# ---- decoding ---------------------------------------------------------------------------------


def decode_resource_aggregate_payload(
    data: bytes, *, max_decoded_bytes: int | None = DEFAULT_MAX_DECODED_BYTES
) -> Decoded:
    """Decode a resource-aggregate payload (docs/wire-format.md §2.5 step 2).

    Parses the envelope, picks the inner class by ``event_type``, snappy-decompresses ``data``
    and parses it. No subject checks (see ``decode_payload``). Accepts bytes, bytearray or
    memoryview (PySpark gives bytearray).

    :param max_decoded_bytes: cap on the decompressed inner event (bytes; None = no cap),
        checked before decompressing.

    :returns: ``Decoded(event_type, inner message, envelope)``.
    :raises PlgdDecodeError: ``bad_protobuf`` (envelope or inner message unparsable, or envelope
        without ``event_type``), ``unknown_event_type`` (not a resource-aggregate type on NATS,
        e.g. a newer hub's type or ``ServiceMetadataUpdated``), ``bad_snappy`` (``data`` is not
        snappy block format), ``content_too_large`` (``data`` would decode to more than
        ``max_decoded_bytes``).
    """
    try:
        envelope = _ENVELOPE.FromString(data)
    except Exception as exc:  # google.protobuf.message.DecodeError; TypeError for non-bytes
        raise PlgdDecodeError(
            "bad_protobuf", f"payload is not a protobuf ocf.cloud.cqrs.eventbus.v2.Event: {short_error(exc)}"
        ) from exc
    event_type = envelope.event_type
    if not event_type:
        raise PlgdDecodeError(
            "bad_protobuf",
            "payload parsed as ocf.cloud.cqrs.eventbus.v2.Event but has no event_type "
            "(not a plgd envelope)",
        )
    cls = _RA_CLASSES.get(event_type)
    if cls is None:
        raise PlgdDecodeError(
            "unknown_event_type",
            f"envelope event_type {event_type!r} is not a resource-aggregate event type on NATS",
        )
    raw = decompress(envelope.data, f"envelope data of a {event_type!r} event", max_decoded_bytes)
    try:
        message = cls.FromString(raw)
    except Exception as exc:
        raise PlgdDecodeError(
            "bad_protobuf",
            f"inner {event_type!r} event is not a protobuf "
            f"resourceaggregate.pb.{cls.DESCRIPTOR.name}: {short_error(exc)}",
        ) from exc
    return Decoded(event_type, message, envelope)


def decode_identity_store_payload(
    data: bytes, event_type: str | None = None, *,
    max_decoded_bytes: int | None = DEFAULT_MAX_DECODED_BYTES,
) -> Decoded:
    """Decode an identity-store payload (docs/wire-format.md §2.5 step 1, §3.4).

    Snappy-decompresses, parses ``identitystore.pb.Event``, and maps the set oneof member
    (``devices_registered``/``devices_unregistered``) to the event type.

    :param event_type: the subject's event type, if known; must then match the body.
    :param max_decoded_bytes: cap on the decompressed event (bytes; None = no cap), checked
        before decompressing.
    :returns: ``Decoded(event_type, DevicesRegistered | DevicesUnregistered, None)``.
    :raises PlgdDecodeError: ``bad_snappy``; ``content_too_large`` (over ``max_decoded_bytes``);
        ``bad_protobuf`` (unparsable, or empty after decompression); ``unknown_event_type`` (no known oneof member set, or ``event_type`` is
        not an identity-store type); ``subject_mismatch`` (body type differs from ``event_type``).
    """
    if event_type is not None and event_type not in _IS_TYPES:
        raise PlgdDecodeError(
            "unknown_event_type",
            f"{event_type!r} is not an identity-store event type "
            f"(expected one of {sorted(_IS_TYPES)})",
        )
    raw = decompress(data, "identity-store payload", max_decoded_bytes)
    if not raw:
        raise PlgdDecodeError("bad_protobuf", "identity-store payload decompresses to 0 bytes")
    try:
        event = _IS_EVENT.FromString(raw)
    except Exception as exc:
        raise PlgdDecodeError(
            "bad_protobuf", f"identity-store payload is not a protobuf identitystore.pb.Event: {short_error(exc)}"
        ) from exc
    which = event.WhichOneof("type")
    if which is None:
        raise PlgdDecodeError(
            "unknown_event_type",
            "identitystore.pb.Event sets no known member of oneof 'type' "
            f"(known: {', '.join(IDENTITY_STORE_ONEOF_TO_EVENT_TYPE)})",
        )
    body_type = IDENTITY_STORE_ONEOF_TO_EVENT_TYPE[which]
    if event_type is not None and body_type != event_type:
        raise PlgdDecodeError(
            "subject_mismatch", f"subject event type {event_type!r} but payload is {body_type!r}"
        )
    return Decoded(body_type, getattr(event, which), None)


def decode_payload(
    subject: str | Subject, data: bytes, *, max_decoded_bytes: int | None = DEFAULT_MAX_DECODED_BYTES
) -> Decoded:
    """Decode a NATS message of plgd: parse the subject, pick the format, decode, cross-check.

    Checks (docs/wire-format.md §1, §2): the body's event type equals the subject's; for device
    families the inner device ID and the envelope ``group_id`` equal the subject's ``deviceId``;
    for resources ``ids.href_id(resource_id.href)`` equals the subject's ``hrefId``. The owner
    token and the lead resource type are not checked (the body does not carry the hashed owner,
    and the lead type depends on hub configuration).

    :param subject: the message subject, or an already parsed ``Subject``.
    :param data: the payload (bytes, bytearray or memoryview).
    :param max_decoded_bytes: cap on the snappy-decompressed event (bytes; None = no cap), so on
        its resource content; default :data:`DEFAULT_MAX_DECODED_BYTES`. Checked before
        decompressing; over it: ``content_too_large``.
    :raises PlgdDecodeError: ``bad_subject`` (unparsable subject, or its event type belongs to
        another family), ``unknown_event_type`` (subject or body type unknown), and every reason
        of the two format decoders, ``subject_mismatch`` for the checks above.
    """
    if isinstance(subject, Subject):
        parsed = subject
    else:
        try:
            parsed = parse_subject(subject, check_event_type=False)
        except (ValueError, TypeError) as exc:
            raise PlgdDecodeError("bad_subject", str(exc)) from exc
    info = EVENT_TYPES.get(parsed.event_type)
    if info is None:
        raise PlgdDecodeError(
            "unknown_event_type", f"subject {str(parsed)!r} has unknown event type {parsed.event_type!r}"
        )
    if info.family != parsed.family:
        raise PlgdDecodeError(
            "bad_subject",
            f"subject {str(parsed)!r}: event type {parsed.event_type!r} belongs to family "
            f"{info.family!r}, not {parsed.family!r}",
        )
    if parsed.family == FAMILY_REGISTRATIONS:
        return decode_identity_store_payload(data, parsed.event_type, max_decoded_bytes=max_decoded_bytes)

    decoded = decode_resource_aggregate_payload(data, max_decoded_bytes=max_decoded_bytes)
    if decoded.event_type != parsed.event_type:
        raise PlgdDecodeError(
            "subject_mismatch",
            f"subject {str(parsed)!r} has event type {parsed.event_type!r} "
            f"but the envelope says {decoded.event_type!r}",
        )
    message = decoded.message
    if parsed.family == FAMILY_RESOURCES:
        resource_id = message.resource_id
        device_id = resource_id.device_id
        href = resource_id.href
    else:
        device_id = message.device_id
        href = None
    if device_id != parsed.device_id:
        raise PlgdDecodeError(
            "subject_mismatch",
            f"subject {str(parsed)!r} has device {parsed.device_id!r} "
            f"but the event is for device {device_id!r}",
        )
    if decoded.envelope.group_id != parsed.device_id:
        raise PlgdDecodeError(
            "subject_mismatch",
            f"subject {str(parsed)!r} has device {parsed.device_id!r} "
            f"but the envelope group_id is {decoded.envelope.group_id!r}",
        )
    if href is not None and href_id(href) != parsed.href_id:
        raise PlgdDecodeError(
            "subject_mismatch",
            f"subject {str(parsed)!r} has hrefId {parsed.href_id!r} but the event is for "
            f"href {href!r} (hrefId {href_id(href)!r})",
        )
    return decoded
