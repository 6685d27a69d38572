"""A stream's info as the provider reads it: the fields of a ``$JS.API.STREAM.INFO`` answer that the
fetch, the plan, the sensors and the completeness rule use, typed once where the answer arrives.

:meth:`StreamInfo.from_api` builds it from the answer (``JetStreamInfoHook.aget_stream_info``);
the raw answer stays available as ``JetStreamInfoHook.astream_info`` (a dict, for users).
Source: NATS docs, "JetStream wire API reference" (``STREAM.INFO``: ``config``, ``state``,
``created``, ``ts``, ``mirror``, ``sources``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_plgd.jetstream.api import StreamState
from airflow_provider_plgd.times import parse_rfc3339_ns


@dataclass(frozen=True)
class SourceLink:
    """A stream feeding this one, as the answer reports it (``mirror`` or one of ``sources``).

    :ivar kind: ``"mirror"`` or ``"source"``. :ivar name: the upstream stream's name.
    :ivar api: the external API prefix (e.g. ``$JS.hub.API``), or None.
    :ivar lag: messages the origin still held after the last one received.
    :ivar active_ns: ns since the last contact (None: never).
    :ivar error: the server's description of the link's error, or None.
    """

    kind: str
    name: str | None
    api: str | None
    lag: int
    active_ns: int | None
    error: str | None

    @classmethod
    def from_api(cls, kind: str, value: Mapping[str, Any]) -> SourceLink:
        """The link of one ``mirror`` / ``sources[]`` entry of the answer."""
        active = value.get("active")
        error = value.get("error")
        return cls(kind=kind, name=value.get("name"), api=(value.get("external") or {}).get("api"),
                   lag=int(value.get("lag") or 0),
                   active_ns=int(active) if isinstance(active, (int, float)) and active >= 0 else None,
                   error=(error.get("description") or str(error)) if isinstance(error, dict) else error)


@dataclass(frozen=True)
class StreamInfo:
    """The fields of a ``$JS.API.STREAM.INFO`` answer the provider uses.

    :ivar name: the stream's name (``config.name``). :ivar subjects: the subjects it stores (``config.subjects``).
    :ivar created: when the stream was created (RFC 3339, as the server gave it; a re-created stream
        has a new one). :ivar server_time: the server's time of the answer (``ts``, RFC 3339;
        None from nats-server older than 2.10).
    :ivar state: the stream state (messages, bytes, first and last sequence and time).
    :ivar links: the mirror (first) and sources feeding the stream; empty for a plain stream.
    """

    name: str | None
    subjects: tuple[str, ...]
    created: str | None
    server_time: str | None
    state: StreamState
    links: tuple[SourceLink, ...] = ()

    @classmethod
    def from_api(cls, info: Mapping[str, Any]) -> StreamInfo:
        """The info of one ``$JS.API.STREAM.INFO`` answer (other fields left out)."""
        config = info.get("config") or {}
        links = [SourceLink.from_api("mirror", info["mirror"])] if info.get("mirror") else []
        links += [SourceLink.from_api("source", si) for si in info.get("sources") or [] if si]
        return cls(name=config.get("name"), subjects=tuple(config.get("subjects") or ()), created=info.get("created"),
                   server_time=info.get("ts"), state=StreamState.from_dict(info.get("state")), links=tuple(links))

    @classmethod
    def of(cls, info: StreamInfo | Mapping[str, Any]) -> StreamInfo:
        """``info`` itself, or the info of an answer's dict (:meth:`from_api`)."""
        return info if isinstance(info, StreamInfo) else cls.from_api(info)

    @property
    def server_time_ns(self) -> int | None:
        """:attr:`server_time` as unix ns, or None when the answer had none."""
        return parse_rfc3339_ns(self.server_time)
