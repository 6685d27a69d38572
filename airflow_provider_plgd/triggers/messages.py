"""Event trigger for Airflow 3 event-driven scheduling: fire when new messages arrive on a subject filter.

Use it in an ``AssetWatcher`` directly, or through the common.messaging provider with
``MessageQueueTrigger(scheme="nats", subject_filter=..., ...)`` (resolved by
:class:`airflow_provider_plgd.queues.nats.NatsMessageQueueProvider`)::

    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
    from airflow.sdk import Asset, AssetWatcher

    trigger = MessageQueueTrigger(scheme="nats", subject_filter="plgd.owners.*.registrations.>")
    asset = Asset("plgd_registrations", watchers=[AssetWatcher(name="nats_watcher", trigger=trigger)])

Each event covers the new messages of the filter as a stream-sequence range, so the DAG that
the asset schedules can fetch exactly them with ``JetStreamToStagingOperator(start_seq=...,
end_seq=...)`` from ``triggering_asset_events``. Source: Airflow docs "Event-driven scheduling"
and the common.messaging provider's ``MessageQueueTrigger``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from airflow_provider_plgd.compat import BaseEventTrigger, TriggerEvent
from airflow_provider_plgd.triggers.interval_complete import raise_if_cancelling

if TYPE_CHECKING:
    from airflow_provider_plgd.hooks.info import JetStreamInfoHook

CLASSPATH = "airflow_provider_plgd.triggers.messages.JetStreamMessageTrigger"
#: Key of the cursor in the watched asset's state store (Airflow 3.3+), so a restarted triggerer resumes.
STATE_KEY = "plgd_jetstream_last_seq"


class JetStreamMessageTrigger(BaseEventTrigger):
    """Fire an event whenever the stream holds new messages of ``subject_filter``.

    The trigger keeps a cursor (a stream sequence). Every ``poll_interval`` seconds it reads the
    stream's last sequence ``head`` and counts the filter's messages in ``(cursor, head]``; when
    there are any it yields one event and moves the cursor to ``head``. The cursor starts at
    ``start_seq - 1`` when given, else at the state saved in the watched asset's state store
    (Airflow 3.3+, key ``plgd_jetstream_last_seq``), else at the stream's last sequence (only
    messages published after the trigger starts count).

    Event payload (JSON; also the asset event's ``extra["payload"]``)::

        {"stream": "EVENTS", "subject_filter": "plgd.>", "first_seq": 101, "last_seq": 250,
         "count": 17}

    ``first_seq``/``last_seq`` bound a sequence range that holds the ``count`` new messages
    (messages of other subjects in the range are not counted). Connection errors are logged and
    retried at the next poll.

    :param subject_filter: JetStream filter subject (wildcards allowed).
    :param stream: stream name (None: the connection's ``stream`` extra, else ``EVENTS``).
    :param jetstream_conn_id: Airflow connection of type ``plgd_jetstream``.
    :param poll_interval: seconds between checks (default 5).
    :param start_seq: first sequence to report (None: see above).
    """

    def __init__(
        self,
        *,
        subject_filter: str = "plgd.>",
        stream: str | None = None,
        jetstream_conn_id: str = "plgd_jetstream_default",
        poll_interval: float = 5.0,
        start_seq: int | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(subject_filter, str) or not subject_filter.strip():
            raise ValueError(f"subject_filter must be a NATS filter subject, got {subject_filter!r}")
        self.subject_filter = subject_filter
        self.stream = stream
        self.jetstream_conn_id = jetstream_conn_id
        self.poll_interval = float(poll_interval)
        self.start_seq = None if start_seq is None else int(start_seq)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Return the classpath and JSON-only kwargs (str, int, float, None)."""
        return CLASSPATH, {
            "subject_filter": self.subject_filter,
            "stream": self.stream,
            "jetstream_conn_id": self.jetstream_conn_id,
            "poll_interval": self.poll_interval,
            "start_seq": self.start_seq,
        }

    def _state_store(self) -> Any:
        store = getattr(self, "asset_state_store", None)
        try:
            if store is not None:
                return store._single_accessor()  # one watched asset
        except Exception:  # several or no assets: no persistent cursor
            return None
        return None

    async def _load_cursor(self, hook: JetStreamInfoHook) -> int:
        if self.start_seq is not None:
            return max(self.start_seq - 1, 0)
        store = self._state_store()
        if store is not None:
            try:
                saved = await store.aget(STATE_KEY)
                if saved is not None:
                    return int(saved)
            except Exception as exc:
                self.log.warning("Could not read the saved cursor: %s", exc)
        return (await hook.aget_stream_info(self.stream)).state.head

    async def _save_cursor(self, cursor: int) -> None:
        store = self._state_store()
        if store is not None:
            try:
                await store.aset(STATE_KEY, cursor)
            except Exception as exc:
                self.log.warning("Could not save the cursor: %s", exc)

    async def poll_once(self, hook: JetStreamInfoHook, cursor: int) -> tuple[int, dict[str, Any] | None]:
        """One check: return ``(new cursor, event payload or None)``."""
        head = (await hook.aget_stream_info(self.stream)).state.head
        if head <= cursor:
            return cursor, None
        count = await hook.acount_messages(self.subject_filter, start_seq=cursor + 1, end_seq=head)
        if not count:
            return head, None
        return head, {
            "stream": self.stream or hook.stream,
            "subject_filter": self.subject_filter,
            "first_seq": cursor + 1,
            "last_seq": head,
            "count": int(count),
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Poll forever; yield one event per poll that finds new messages."""
        # lazy: the hook (and nats) load in the triggerer's run, not when a DAG file is parsed
        from airflow_provider_plgd.hooks.jetstream import JetStreamHook

        hook = JetStreamHook(jetstream_conn_id=self.jetstream_conn_id, stream=self.stream)
        cursor: int | None = None
        while True:
            try:
                if cursor is None:
                    cursor = await self._load_cursor(hook)
                    self.log.info("Watching %s on stream %s after seq %s", self.subject_filter,
                                  self.stream or hook.stream, cursor)
                cursor, payload = await self.poll_once(hook, cursor)
            except Exception as exc:  # keep watching through outages
                self.log.warning("Polling JetStream failed (retrying in %.1f s): %s", self.poll_interval, exc)
                payload = None
            if payload is not None and cursor is not None:  # a payload comes with its cursor
                await self._save_cursor(cursor)
                yield TriggerEvent(payload)
            raise_if_cancelling()
            await asyncio.sleep(self.poll_interval)
