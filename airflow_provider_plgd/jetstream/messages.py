"""One stored JetStream message as the hook hands it out, and the metadata of its delivery.

A message delivered by a consumer carries its metadata in its reply subject (the subject to
acknowledge it on): ``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<timestamp
ns>.<pending>`` (9 tokens), or the form with domain and account hash after ``ACK`` (11 or 12
tokens). Source: NATS ADR-15 (JetStream subject naming).

nats-py parses it too (``nats.aio.msg.Msg.metadata``), but its ``Metadata.timestamp`` is a
``datetime`` (microseconds) and it builds three objects per message; the staging contract keeps
the server's nanoseconds, and the pull engine parses once per message, so we parse it here, once.
"""

from __future__ import annotations

from typing import NamedTuple


class StreamMessage(NamedTuple):
    """One stored JetStream message.

    :ivar stream_seq: stream sequence number (int, >= 1).
    :ivar subject: the subject it was published on.
    :ivar time_ns: JetStream server timestamp when stored, unix ns.
    :ivar headers: NATS headers (name -> value) or None when the message has none.
    :ivar data: the payload bytes.
    """

    stream_seq: int
    subject: str
    time_ns: int
    headers: dict[str, str] | None
    data: bytes


def parse_ack_reply(reply: str) -> tuple[int, int, int, int]:
    """Parse a JetStream message reply subject into ``(stream_seq, consumer_seq, time_ns, pending)``.

    Forms: ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts_ns>.<pending>`` (9 tokens)
    and ``$JS.ACK.<domain>.<acc hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts_ns>.<pending>[.<token>]``
    (11 or 12 tokens). Source: NATS ADR-15 (JetStream subject naming).

    :raises ValueError: not a JetStream ack subject (message names it).
    """
    t = reply.split(".")
    n = len(t)
    o = 5 if n == 9 else 7 if n >= 11 else 0
    if not o or t[0] != "$JS" or t[1] != "ACK":
        raise ValueError(f"not a JetStream ack reply subject: {reply!r}")
    return int(t[o]), int(t[o + 1]), int(t[o + 2]), int(t[o + 3])
