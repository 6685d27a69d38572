"""A durable pull consumer with explicit acknowledgement (the fetch operator's durable mode).

The consumer is created on first use (ack policy ``explicit``, ``max_ack_pending`` and
``max_deliver`` unlimited, deliver policy ``all``) and checked on later uses; messages are fetched
with nats-py's pull subscription and acknowledged by the caller after its commit
(:meth:`DurableConsumer.ack`). Opened by :meth:`JetStreamHook.adurable_consumer`.

Source: NATS docs, "JetStream consumers" (durable pull consumers, AckExplicit, AckWait,
MaxDeliver); nats-py 2.x ``JetStreamContext.consumer_info``, ``add_consumer``,
``pull_subscribe_bind``, ``Msg.ack``/``ack_sync``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_plgd.hooks.messages import StreamMessage, parse_ack_reply


class DurableConsumer:
    """A durable consumer of one stream, bound to an open connection.

    :ivar name: the consumer name. :ivar stream: the stream.
    :ivar num_pending: messages not yet delivered to it (at open).
    :ivar num_ack_pending: messages delivered and not yet acknowledged (at open).
    """

    def __init__(self, nc: Any, stream: str, name: str, info: Any, psub: Any) -> None:
        self._nc = nc
        self._psub = psub
        self.stream = stream
        self.name = name
        self.num_pending = int(info.num_pending or 0)
        self.num_ack_pending = int(info.num_ack_pending or 0)

    @classmethod
    async def open(cls, nc: Any, stream: str, name: str, filters: Sequence[str], *,
                   ack_wait_seconds: float) -> DurableConsumer:
        """Create (ack policy explicit) or check durable consumer ``name`` and bind a pull subscription.

        :raises ValueError: it exists with other filters, with another ack policy (a consumer of
            earlier versions, ack policy ``all``: the message says how to switch safely), or with
            ``max_deliver`` (the server would drop messages after that many deliveries).
        """
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
        from nats.js.errors import NotFoundError

        js = nc.jetstream()
        filters = list(filters)
        try:
            info = await js.consumer_info(stream, name)
        except NotFoundError:
            info = await js.add_consumer(stream, ConsumerConfig(
                durable_name=name,
                deliver_policy=DeliverPolicy.ALL,
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=float(ack_wait_seconds),
                max_ack_pending=-1,
                max_deliver=-1,
                filter_subject=filters[0] if len(filters) == 1 else None,
                filter_subjects=filters if len(filters) > 1 else None,
            ))
        else:
            _check_existing(info, stream, name, filters, ack_wait_seconds, AckPolicy.EXPLICIT.value)
        return cls(nc, stream, name, info, await js.pull_subscribe_bind(durable=name, stream=stream))

    async def fetch(self, count: int, *, timeout: float = 5.0) -> list[tuple[StreamMessage, str]]:
        """Up to ``count`` messages as ``(message, reply subject)``; ``[]`` when none came within
        ``timeout`` seconds. The reply subject is what :meth:`ack` takes."""
        from nats.errors import TimeoutError as NatsTimeoutError

        try:
            msgs = await self._psub.fetch(count, timeout=timeout)
        except NatsTimeoutError:
            return []
        out = []
        for msg in msgs:
            seq, _, time_ns, _ = parse_ack_reply(msg.reply)
            out.append((StreamMessage(seq, msg.subject, time_ns, msg.headers or None, msg.data), msg.reply))
        return out

    async def ack(self, replies: Mapping[int, str]) -> None:
        """Acknowledge each delivered message (``{stream seq: reply subject}``): the first with a
        confirmed ack (``+ACK`` request, nats-py ``Msg.ack_sync``), the others with plain ``+ACK``
        publishes, then a flush (the server has received them all when it returns)."""
        from nats.aio.msg import Msg

        seqs = sorted(replies)
        await Msg(_client=self._nc, reply=replies[seqs[0]]).ack_sync(timeout=10.0)
        for seq in seqs[1:]:
            await Msg(_client=self._nc, reply=replies[seq]).ack()
        await self._nc.flush(timeout=10)


def _check_existing(info: Any, stream: str, name: str, filters: list[str], ack_wait_seconds: float,
                    explicit: str) -> None:
    """Refuse an existing consumer that does not fit (see :meth:`DurableConsumer.open`)."""
    config = info.config
    existing = list(config.filter_subjects or ([config.filter_subject] if config.filter_subject else []))
    if existing != filters:
        raise ValueError(
            f"durable consumer {name!r} on stream {stream!r} already exists with filters {existing}, "
            f"not {filters}; use another name for another selection"
        )
    policy = getattr(config.ack_policy, "value", config.ack_policy)
    if policy != explicit:
        floor = int(getattr(info.ack_floor, "stream_seq", 0) or 0)
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
    if config.max_deliver not in (None, -1, 0):
        raise ValueError(
            f"durable consumer {name!r} on stream {stream!r} has max_deliver {config.max_deliver}: the server "
            "would drop a message after that many failed attempts; recreate it with max_deliver -1"
        )
