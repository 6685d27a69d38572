"""The message-ID rule used for deduplication (the one home of this rule).

Source: ``docs/architecture.md``, "Message ID": plgd sets no ``Nats-Msg-Id``
header (docs/wire-format.md §2.4), so the ID is the header when present, otherwise derived
deterministically: for resource-aggregate events from ``aggregate_id``, ``version``,
``event_type`` and ``event_metadata.timestamp`` (docs/wire-format.md §4.9 rule 2); for
identity-store events from a hash of the subject and payload.
"""

from __future__ import annotations

import hashlib

__all__ = ["IDENTITY_STORE_PREFIX", "RESOURCE_AGGREGATE_PREFIX", "message_id"]

RESOURCE_AGGREGATE_PREFIX = "ra:"
IDENTITY_STORE_PREFIX = "is:"


def message_id(
    *,
    header_msg_id: str | None,
    subject: str,
    data: bytes,
    aggregate_id: str | None = None,
    version: int | None = None,
    event_type: str | None = None,
    timestamp: int | None = None,
) -> str:
    """Deterministic message ID of a plgd NATS message (docs/architecture.md, "Message ID").

    1. ``header_msg_id`` (the ``Nats-Msg-Id`` header) wins when it is a non-empty string (an
       empty header value counts as absent, as it does for JetStream's own dedupe).
    2. Resource-aggregate event (``aggregate_id`` is not None):
       ``"ra:{aggregate_id}:{version}:{event_type}:{timestamp}"`` with ``version`` the aggregate
       version (int), ``event_type`` the §3.1 string and ``timestamp`` the inner
       ``event_metadata.timestamp`` (int, unix ns). Example:
       ``"ra:7d1aabc8-742c-5bd7-8d42-2fbf77af9440:3:resourcechanged:1700000000000000000"``.
    3. Otherwise (identity-store events, which have no aggregate; and any payload whose
       aggregate is unknown): ``"is:" + sha256(subject.encode() + b"\\n" + data).hexdigest()``
       (67 characters).

    :param header_msg_id: the ``Nats-Msg-Id`` header value, or None.
    :param subject: the NATS subject (UTF-8 encoded for the hash).
    :param data: the raw payload bytes (bytes, bytearray or memoryview).
    :raises ValueError: ``aggregate_id`` is given but ``version``, ``event_type`` or
        ``timestamp`` is None (the message names the missing ones).
    :raises TypeError: ``subject`` is not a str, or ``data`` is not bytes-like (hash form).
    """
    if header_msg_id:
        return header_msg_id
    if aggregate_id is not None:
        if version is None or event_type is None or timestamp is None:
            missing = [
                name
                for name, value in (("version", version), ("event_type", event_type), ("timestamp", timestamp))
                if value is None
            ]
            raise ValueError(
                f"message_id for aggregate {aggregate_id!r} needs {', '.join(missing)} "
                "(resource-aggregate rule: aggregate_id, version, event_type, timestamp)"
            )
        return f"{RESOURCE_AGGREGATE_PREFIX}{aggregate_id}:{version}:{event_type}:{timestamp}"
    if not isinstance(subject, str):
        raise TypeError(f"subject must be a str, got {type(subject).__name__}: {subject!r}")
    digest = hashlib.sha256(subject.encode("utf-8"))
    digest.update(b"\n")
    digest.update(data)
    return IDENTITY_STORE_PREFIX + digest.hexdigest()
