"""The producing role of the JetStream hooks: publish into the stream and wait for its PubAck.

:class:`JetStreamProduceHook` publishes one message at a time with a JetStream PubAck
(:meth:`.api.JetStreamApi.publish`); ``publish`` is the sync twin (:func:`.blocking.blocking`).
"""

from __future__ import annotations

from airflow_provider_plgd.hooks.base import JetStreamBaseHook
from airflow_provider_plgd.jetstream.blocking import blocking


class JetStreamProduceHook(JetStreamBaseHook):
    """Publish messages into the stream (each acknowledged by the server)."""

    async def apublish(
        self, subject: str, data: bytes, *, msg_id: str | None = None, headers: dict[str, str] | None = None
    ) -> int:
        """Publish one message into the stream and wait for the JetStream PubAck.

        With ``msg_id`` the header ``Nats-Msg-Id`` is set: the server drops a second message with
        the same id within the stream's duplicate_window (10 min in the plgd bundle) and acks it
        with the first one's sequence. No other header is added, so a message without ``msg_id``
        and ``headers`` is stored exactly like plgd's own (docs/wire-format.md §2.4).

        :return: the stream sequence of the stored (or deduplicated original) message.
        :raises TypeError: data is not bytes. :raises ValueError: subject not a literal subject.
        :raises StreamNotFoundError: the stream does not exist, or ``subject`` is not stored by it.
        :raises JetStreamTimeoutError: no PubAck in time. :raises JetStreamAPIError: an error PubAck.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data must be bytes, got {type(data).__name__}")
        if not subject or not isinstance(subject, str) or any(c in subject for c in " \t\r\n*>"):
            raise ValueError(f"subject must be a literal NATS subject, got {subject!r}")
        s = await self.aget_settings()
        hdrs = dict(headers or {})
        if msg_id is not None:
            hdrs["Nats-Msg-Id"] = str(msg_id)
        async with self.aconnect() as nc:
            return await self.api(nc).publish(s.stream, subject, bytes(data), hdrs)

    publish = blocking(apublish)
