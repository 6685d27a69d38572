"""The JetStream API client: the package's one JetStream protocol layer.

:class:`JetStreamApi` sends every ``$JS.API`` request of the package over an open nats-py client
and maps the errors once to ours (``exceptions.py``): stream info, ephemeral consumers for
counting (:mod:`.counting`) and reading (:mod:`.pull`), durable consumers (:mod:`.durable`: create,
info, pulls, acks), single messages, stream creation and publishing with a PubAck. Only the small
JSON bodies are ours; the connection and requests are nats-py's core client (why not nats-py's
JetStream layer: ``docs/architecture.md``, "The hooks by role, and one JetStream protocol layer").

Source: NATS docs, "JetStream wire API reference" (``$JS.API.STREAM.INFO`` paging, ``STREAM.MSG.GET``,
``STREAM.CREATE``, ``$JS.API.CONSUMER.CREATE``/``INFO``/``DELETE``/``MSG.NEXT``, acks, error codes).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from airflow_provider_plgd.exceptions.jetstream import (
    JetStreamAPIError,
    JetStreamConnectionError,
    JetStreamNotEnabledError,
    JetStreamTimeoutError,
    StreamNotFoundError,
)
from airflow_provider_plgd.jetstream.messages import StreamMessage
from airflow_provider_plgd.times import NS_PER_S, ns_to_rfc3339, parse_rfc3339_ns

#: Seconds to wait for a JetStream API answer.
API_TIMEOUT_S = 10.0

_ERR_STREAM_NOT_FOUND = 10059
_ERR_JS_NOT_ENABLED = (10039, 10076)  # for the account / on the server
_ERR_CONSUMER_NOT_FOUND = 10014

RequestFn = Callable[[str, "dict | None"], Awaitable[dict]]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamState:
    """The ``state`` of a ``$JS.API.STREAM.INFO`` answer, the fields the fetch and the ledger use,
    as the server gave them (None when it left one out; the plan record keeps :meth:`as_dict`).

    :ivar messages: messages stored. :ivar bytes: their bytes.
    :ivar first_seq: the first retained stream sequence. :ivar last_seq: the last one.
    :ivar first_ts: RFC 3339 server time of the first retained message (``last_ts``: of the last).
    :ivar num_deleted: sequences inside ``[first_seq, last_seq]`` that were deleted.
    """

    messages: int | None = None
    bytes: int | None = None
    first_seq: int | None = None
    last_seq: int | None = None
    first_ts: str | None = None
    last_ts: str | None = None
    num_deleted: int | None = None

    @classmethod
    def from_dict(cls, value: Mapping[str, Any] | None) -> StreamState:
        """The state of a stream info answer's ``state`` (other fields left out)."""
        value = value or {}
        return cls(**{f.name: value.get(f.name) for f in fields(cls)})

    @classmethod
    def of_info(cls, info: Mapping[str, Any]) -> StreamState:
        """The state of a whole stream info answer (``JetStreamHook.astream_info``)."""
        return cls.from_dict(info.get("state"))

    def as_dict(self) -> dict[str, Any]:
        """``{messages, bytes, first_seq, last_seq, first_ts, last_ts, num_deleted}`` (the ledger's ``stream_state``)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def head(self) -> int:
        """The last stream sequence (0 for a stream that never held a message)."""
        return int(self.last_seq or 0)


class JetStreamApi:
    """``$JS.API`` requests over one open nats-py client.

    :param nc: the connected nats-py client. :param where: the servers for messages (no credentials).
    :param log: where failed best-effort deletes are logged (the hook's ``log``).
    """

    def __init__(self, nc: Any, where: str, log: Any = None) -> None:
        self.nc = nc
        self.where = where
        self.log = log or _log

    async def request(self, subject: str, body: dict | None = None, *, timeout: float = API_TIMEOUT_S) -> dict:
        """Send one ``$JS.API`` request and return the decoded answer.

        :raises JetStreamNotEnabledError: no responder, or JetStream off for the account/server.
        :raises JetStreamTimeoutError: no answer within ``timeout`` (s).
        :raises JetStreamConnectionError: the connection closed. :raises StreamNotFoundError: err_code 10059.
        :raises JetStreamAPIError: any other error answer, or an answer that is not JSON.
        """
        # lazy: nats loads when a task talks to the server, not when a DAG file is parsed
        import nats.errors

        where = self.where
        payload = json.dumps(body).encode() if body is not None else b""
        try:
            msg = await self.nc.request(subject, payload, timeout=timeout)
        except nats.errors.NoRespondersError:
            raise JetStreamNotEnabledError(
                f"JetStream is not enabled on {where}: no responder for {subject}"
            ) from None
        except (nats.errors.TimeoutError, asyncio.TimeoutError):
            raise JetStreamTimeoutError(f"no answer from {where} to {subject} within {timeout}s") from None
        except nats.errors.ConnectionClosedError:
            raise JetStreamConnectionError(f"connection to {where} closed during {subject}") from None
        name = subject.split(".")[4] if subject.count(".") >= 4 else "?"
        return self._answer(subject, msg.data, name)

    def _answer(self, what: str, data: bytes, stream: str) -> dict:
        """The decoded JSON answer ``data`` to ``what`` (an API subject, or ``publish to <subject>``),
        its error mapped to ours once (see :meth:`request`; ``stream``: the stream it concerns)."""
        where = self.where
        try:
            resp = json.loads(data)
        except ValueError:
            raise JetStreamAPIError(f"{what}: answer from {where} is not JSON: {data[:200]!r}") from None
        err = resp.get("error")
        if err:
            code, err_code, desc = err.get("code"), err.get("err_code"), err.get("description", "")
            if err_code == _ERR_STREAM_NOT_FOUND:
                raise StreamNotFoundError(f"stream {stream!r} not found on {where}", stream=stream)
            if err_code in _ERR_JS_NOT_ENABLED:
                raise JetStreamNotEnabledError(f"JetStream is not enabled on {where}: {desc}")
            raise JetStreamAPIError(
                f"{what} failed on {where}: {desc} (code {code}, err_code {err_code})",
                code=code,
                err_code=err_code,
                description=desc,
            )
        return resp

    async def stream_info(self, stream: str) -> dict:
        """``$JS.API.STREAM.INFO.<stream>`` (config, state, created; see the hook's ``astream_info``)."""
        return await self.request(f"$JS.API.STREAM.INFO.{stream}")

    async def create_consumer(
        self,
        stream: str,
        filter_subject: str | Sequence[str] | None,
        *,
        start_ns: int | None = None,
        start_seq: int | None = None,
        inactive_threshold_s: float,
        kind: str,
    ) -> dict:
        """Create an ephemeral, ack-none, memory-stored consumer (``filter_subject`` None: every
        subject of the stream; several filters: ``filter_subjects``, nats-server >= 2.10) and
        return its info dict. Deliver policy: ``by_start_sequence`` with ``start_seq``,
        ``by_start_time`` with ``start_ns`` (unix ns), else ``all``. Name ``plgd_{kind}_{random}``."""
        name = f"plgd_{kind}_{secrets.token_hex(8)}"
        config: dict[str, Any] = {
            "name": name,
            "ack_policy": "none",
            "inactive_threshold": int(inactive_threshold_s * NS_PER_S),
            "mem_storage": True,
            "num_replicas": 1,
        }
        filters = [filter_subject] if isinstance(filter_subject, str) else list(filter_subject or [])
        if len(filters) == 1 and filters[0]:
            config["filter_subject"] = filters[0]
        elif len(filters) > 1:
            config["filter_subjects"] = filters
        if start_seq is not None:
            config.update(deliver_policy="by_start_sequence", opt_start_seq=max(1, start_seq))
        elif start_ns is not None:
            config.update(deliver_policy="by_start_time", opt_start_time=ns_to_rfc3339(start_ns))
        else:
            config["deliver_policy"] = "all"
        return await self.request(f"$JS.API.CONSUMER.CREATE.{stream}.{name}", {"stream_name": stream, "config": config})

    async def consumer_pending(self, stream: str, name: str) -> int:
        """``num_pending`` of a consumer (``$JS.API.CONSUMER.INFO``)."""
        return int((await self.request(f"$JS.API.CONSUMER.INFO.{stream}.{name}"))["num_pending"])

    async def delete_consumer(self, stream: str, name: str) -> None:
        """Delete a consumer, best effort (the server removes it after its inactive threshold anyway)."""
        try:
            if not self.nc.is_closed:
                await self.request(f"$JS.API.CONSUMER.DELETE.{stream}.{name}", timeout=2.0)
        except Exception as exc:  # best effort
            self.log.warning("Could not delete consumer %s of stream %s: %s", name, stream, exc)

    async def consumer_info(self, stream: str, name: str) -> dict | None:
        """``$JS.API.CONSUMER.INFO.<stream>.<name>`` (``config``, ``num_pending``, ``num_ack_pending``,
        ``ack_floor``, ...), or None when the consumer does not exist (err_code 10014)."""
        try:
            return await self.request(f"$JS.API.CONSUMER.INFO.{stream}.{name}")
        except JetStreamAPIError as exc:
            if exc.err_code == _ERR_CONSUMER_NOT_FOUND:
                return None
            raise

    async def create_durable(self, stream: str, name: str, filters: Sequence[str], *, ack_wait_s: float) -> dict:
        """Create durable pull consumer ``name`` (deliver all, ack policy explicit, ``ack_wait``
        = ``ack_wait_s`` s, ``max_ack_pending`` and ``max_deliver`` unlimited, ``filters``: one
        ``filter_subject`` or several ``filter_subjects``) and return its info."""
        filters = list(filters)
        config: dict[str, Any] = {
            "durable_name": name, "deliver_policy": "all", "ack_policy": "explicit",
            "ack_wait": int(ack_wait_s * NS_PER_S), "max_ack_pending": -1, "max_deliver": -1,
        }
        if len(filters) == 1:
            config["filter_subject"] = filters[0]
        elif filters:
            config["filter_subjects"] = filters
        return await self.request(f"$JS.API.CONSUMER.CREATE.{stream}.{name}", {"stream_name": stream, "config": config})

    async def fetch(self, stream: str, consumer: str, count: int, *, timeout: float) -> list[Any]:
        """Pull up to ``count`` messages of pull consumer ``consumer`` (nats-py ``Msg``: ``subject``,
        ``reply``, ``headers``, ``data``): first what is available now (``no_wait``), else what
        arrives within ``timeout`` s (``expires``); ``[]`` when nothing came.
        Messages of a pull that arrive after it returned stay unacknowledged (redelivered after ``ack_wait``).

        :raises JetStreamAPIError: a pull status other than 404/408/409 (e.g. the consumer was deleted).
        :raises JetStreamConnectionError: the connection closed.
        """
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox)
        try:
            got = await self._pull(sub, inbox, stream, consumer, {"batch": count, "no_wait": True}, count, timeout)
            if not got:
                got = await self._pull(sub, inbox, stream, consumer,
                                       {"batch": count, "expires": int(timeout * NS_PER_S)}, count, timeout + 1.0)
            return got
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _pull(self, sub: Any, inbox: str, stream: str, consumer: str, body: dict, count: int,
                    wait_s: float) -> list[Any]:
        """One ``$JS.API.CONSUMER.MSG.NEXT`` pull into ``sub``: messages until ``count``, a
        terminal status (404 no messages, 408 expired, 409 ended) or ``wait_s`` seconds."""
        # lazy: nats loads when a task talks to the server, not when a DAG file is parsed
        import nats.errors

        try:
            await self.nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}", json.dumps(body).encode(),
                                  reply=inbox)
        except nats.errors.Error as exc:
            raise JetStreamConnectionError(f"connection to {self.where} lost while pulling from consumer "
                                           f"{consumer} of stream {stream} ({type(exc).__name__})") from exc
        deadline = asyncio.get_running_loop().time() + wait_s
        msgs: list[Any] = []
        while len(msgs) < count:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            try:
                msg = await sub.next_msg(timeout=left)
            except (nats.errors.TimeoutError, asyncio.TimeoutError):
                break
            if msg.reply:
                msgs.append(msg)
                continue
            status = (msg.headers or {}).get("Status", "")
            if status == "100":  # heartbeat
                continue
            if status in ("404", "408", "409"):
                break
            desc = (msg.headers or {}).get("Description", "")
            raise JetStreamAPIError(
                f"pull from consumer {consumer} of stream {stream} failed on {self.where}: {status} {desc}",
                code=int(status) if status.isdigit() else None, description=desc,
            )
        return msgs

    async def ack(self, replies: Sequence[str]) -> None:
        """Acknowledge delivered messages by their reply subjects: the first with a confirmed
        ``+ACK`` (a request the server answers), the others with ``+ACK`` publishes, then a flush
        (the server has received them all when it returns)."""
        if not replies:
            return
        await self.nc.request(replies[0], b"+ACK", timeout=API_TIMEOUT_S)
        for reply in replies[1:]:
            await self.nc.publish(reply, b"+ACK")
        await self.nc.flush(timeout=API_TIMEOUT_S)

    async def get_message(self, stream: str, seq: int) -> StreamMessage:
        """The stored message at stream sequence ``seq`` (``$JS.API.STREAM.MSG.GET.<stream>``).

        :raises JetStreamAPIError: no message at ``seq`` (err_code 10037). :raises StreamNotFoundError: no stream.
        """
        msg = (await self.request(f"$JS.API.STREAM.MSG.GET.{stream}", {"seq": int(seq)}))["message"]
        headers = None
        if msg.get("hdrs"):
            lines = base64.b64decode(msg["hdrs"]).decode("utf-8", "replace").split("\r\n")[1:]
            headers = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines if ":" in line)}
        return StreamMessage(int(msg["seq"]), msg["subject"], parse_rfc3339_ns(msg.get("time")) or 0, headers,
                             base64.b64decode(msg.get("data") or b""))

    async def create_stream(self, config: Mapping[str, Any]) -> dict:
        """Create a stream (``$JS.API.STREAM.CREATE.<name>``; ``config`` in the API's JSON form) and return its info."""
        return await self.request(f"$JS.API.STREAM.CREATE.{config['name']}", dict(config))

    async def publish(self, stream: str, subject: str, data: bytes, headers: Mapping[str, str] | None = None, *,
                      timeout: float = API_TIMEOUT_S) -> int:
        """Publish one message and wait for its JetStream PubAck; return its stream sequence.

        :raises StreamNotFoundError: the stream does not exist, or does not store ``subject`` (no
            responder, or another stream acknowledged it). :raises JetStreamTimeoutError: no PubAck in time.
        :raises JetStreamAPIError: an error PubAck, or an answer that is not one.
        """
        # lazy: nats loads when a task talks to the server, not when a DAG file is parsed
        import nats.errors

        try:
            msg = await self.nc.request(subject, bytes(data), timeout=timeout, headers=dict(headers or {}) or None)
        except nats.errors.NoRespondersError:
            # Nobody stored it: find out why, for a clear error (raises if the stream is missing).
            await self.stream_info(stream)
            raise StreamNotFoundError(
                f"stream {stream!r} on {self.where} does not capture subject {subject!r}", stream=stream
            ) from None
        except (nats.errors.TimeoutError, asyncio.TimeoutError):
            raise JetStreamTimeoutError(f"no PubAck from {self.where} for {subject} within {timeout}s") from None
        ack = self._answer(f"publish to {subject}", msg.data, stream)
        if ack.get("stream") != stream:
            raise StreamNotFoundError(
                f"subject {subject!r} was stored by stream {ack.get('stream')!r}, not {stream!r}", stream=stream
            )
        return int(ack["seq"])


async def page_subjects(request: RequestFn, stream: str, subjects_filter: str) -> dict[str, int]:
    """Collect ``{subject: message count}`` of ``stream`` for ``subjects_filter``, page by page.

    Sends ``$JS.API.STREAM.INFO.<stream>`` bodies ``{"subjects_filter": f, "offset": n}``; the
    server answers at most ``limit`` (100 000) subjects in ``state.subjects`` plus ``total`` and
    ``offset``; continues until ``total`` subjects were read or a page is empty.

    :param request: ``async (api_subject, body) -> dict`` (the decoded API answer).
    """
    subjects: dict[str, int] = {}
    offset = 0
    while True:
        resp = await request(f"$JS.API.STREAM.INFO.{stream}", {"subjects_filter": subjects_filter, "offset": offset})
        page = (resp.get("state") or {}).get("subjects") or {}
        subjects.update(page)
        offset += len(page)
        total = resp.get("total")
        if not page or total is None or offset >= total:
            return subjects
