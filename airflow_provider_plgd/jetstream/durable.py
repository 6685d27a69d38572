"""A durable pull consumer with explicit acknowledgement (the fetch operator's durable mode).

The consumer is created on first use (ack policy ``explicit``, ``max_ack_pending`` and
``max_deliver`` unlimited, deliver policy ``all``) and checked on later uses; messages are pulled
(:meth:`.api.JetStreamApi.fetch`) and acknowledged by the caller after its commit
(:meth:`DurableConsumer.ack`). Opened by :meth:`JetStreamConsumeHook.adurable_consumer`; every
request goes through the one JetStream API client (:mod:`.api`).

Source: NATS docs, "JetStream consumers" (durable pull consumers, AckExplicit, AckWait,
MaxDeliver) and "JetStream wire API reference" (``CONSUMER.CREATE``/``INFO``, ``MSG.NEXT``, ``+ACK``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_plgd.jetstream.api import JetStreamApi
from airflow_provider_plgd.jetstream.messages import StreamMessage, parse_ack_reply


class DurableConsumer:
    """A durable consumer of one stream, bound to an open connection.

    :ivar name: the consumer name. :ivar stream: the stream.
    :ivar num_pending: messages not yet delivered to it (at open).
    :ivar num_ack_pending: messages delivered and not yet acknowledged (at open).
    """

    def __init__(self, api: JetStreamApi, stream: str, name: str, info: Mapping[str, Any]) -> None:
        self._api = api
        self.stream = stream
        self.name = name
        self.num_pending = int(info.get("num_pending") or 0)
        self.num_ack_pending = int(info.get("num_ack_pending") or 0)

    @classmethod
    async def open(cls, api: JetStreamApi, stream: str, name: str, filters: Sequence[str], *,
                   ack_wait_seconds: float) -> DurableConsumer:
        """Create (ack policy explicit) or check durable consumer ``name``.

        :raises ValueError: it exists with other filters, with another ack policy (a consumer of
            earlier versions, ack policy ``all``: the message says how to switch safely), or with
            ``max_deliver`` (the server would drop messages after that many deliveries).
        """
        filters = list(filters)
        info = await api.consumer_info(stream, name)
        if info is None:
            info = await api.create_durable(stream, name, filters, ack_wait_s=float(ack_wait_seconds))
        else:
            _check_existing(info, stream, name, filters, ack_wait_seconds, "explicit")
        return cls(api, stream, name, info)

    async def fetch(self, count: int, *, timeout: float = 5.0) -> list[tuple[StreamMessage, str]]:
        """Up to ``count`` messages as ``(message, reply subject)``; ``[]`` when none came within
        ``timeout`` seconds. The reply subject is what :meth:`ack` takes."""
        out = []
        for msg in await self._api.fetch(self.stream, self.name, count, timeout=timeout):
            seq, _, time_ns, _ = parse_ack_reply(msg.reply)
            out.append((StreamMessage(seq, msg.subject, time_ns, msg.headers or None, msg.data), msg.reply))
        return out

    async def ack(self, replies: Mapping[int, str]) -> None:
        """Acknowledge each delivered message (``{stream seq: reply subject}``), in stream order
        (:meth:`.api.JetStreamApi.ack`: the first confirmed, then a flush)."""
        await self._api.ack([replies[seq] for seq in sorted(replies)])


def _check_existing(info: Mapping[str, Any], stream: str, name: str, filters: list[str], ack_wait_seconds: float,
                    explicit: str) -> None:
    """Refuse an existing consumer that does not fit (see :meth:`DurableConsumer.open`)."""
    config = info.get("config") or {}
    single = config.get("filter_subject")
    existing = list(config.get("filter_subjects") or ([single] if single else []))
    if existing != filters:
        raise ValueError(
            f"durable consumer {name!r} on stream {stream!r} already exists with filters {existing}, "
            f"not {filters}; use another name for another selection"
        )
    policy = config.get("ack_policy")
    if policy != explicit:
        floor = int((info.get("ack_floor") or {}).get("stream_seq") or 0)
        raise ValueError(
            f"durable consumer {name!r} on stream {stream!r} has ack policy {policy!r}; the fetch needs "
            "'explicit' (with 'all', a retry within ack_wait acknowledged the messages of the failed attempt "
            f"without staging them). Every message up to its ack floor, stream sequence {floor}, was "
            "committed. To switch without a gap or a re-read, delete it and create it with ack policy "
            f"explicit, starting after the ack floor: nats consumer rm {stream} {name} -f; nats consumer add "
            f"{stream} {name} --pull --ack explicit --deliver {floor + 1} --max-pending -1 --max-deliver -1 "
            f"--wait {int(ack_wait_seconds)}s --replay instant "
            + " ".join(f"--filter {f}" for f in filters) + " --defaults"
        )
    max_deliver = config.get("max_deliver")
    if max_deliver not in (None, -1, 0):
        raise ValueError(
            f"durable consumer {name!r} on stream {stream!r} has max_deliver {max_deliver}: the server "
            "would drop a message after that many failed attempts; recreate it with max_deliver -1"
        )
