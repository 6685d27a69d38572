"""The connection side of the JetStream hooks (connection type ``plgd_jetstream``), shared by every role.

:class:`JetStreamBaseHook` reads the Airflow connection once (settings and their checks:
:mod:`airflow_provider_plgd.jetstream.connection`; secrets registered with Airflow's log masker:
:func:`mask_settings_secrets`), opens a nats-py
client (:meth:`JetStreamBaseHook.aconnect`) and hands out the JetStream API client over it
(:meth:`JetStreamBaseHook.api`, :mod:`airflow_provider_plgd.jetstream.api`). The roles build on it, like the Kafka provider's
hooks: :mod:`.info` (stream info, completeness, counting), :mod:`.consume` (bounded reads and the
durable consumer), :mod:`.produce` (publish); :class:`~.jetstream.JetStreamHook` has them all.

The connection form and its UI metadata are :class:`~.jetstream.JetStreamHook`'s, the class
registered for the connection type (Airflow reads them only from the registered class itself).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from airflow_provider_plgd.compat import BaseHook
from airflow_provider_plgd.exceptions import JetStreamConnectionError
from airflow_provider_plgd.jetstream.api import JetStreamApi
from airflow_provider_plgd.jetstream.client import connect
from airflow_provider_plgd.jetstream.connection import (
    CONN_TYPE,
    JetStreamSettings,
    check_stream_name,
    settings_from_connection,
)
from airflow_provider_plgd.tables.layout import Layout
from airflow_provider_plgd.times import to_ns

if TYPE_CHECKING:
    from typing import Self  # Python 3.11+; annotations only (3.10 is supported)

    from airflow_provider_plgd.tables.layout import Layout


def mask_settings_secrets(s: JetStreamSettings) -> None:
    """Register the connection's secrets with Airflow's secrets masker (task logs show ``***``).

    Airflow masks the password and extras named like a secret (``token``, ``nkey_seed_secret``)
    itself when it reads a connection, but not the former ``nkey_seed`` extra; the hook registers
    every secret it uses, whatever the extra's name. Airflow does not mask values shorter than
    ``[logging] min_length_masked_secret`` (default 5 characters). On Airflow 3 the Task SDK's
    ``mask_secret`` also tells the supervisor process.
    """
    values = s.secret_values()
    if not values:
        return
    # lazy: compat resolves the masker of the installed Airflow on first use
    from airflow_provider_plgd.compat import mask_secret

    if mask_secret is None:  # pragma: no cover - no secrets masker in this Airflow
        return
    for value in values:
        mask_secret(value)


async def amask_settings_secrets(s: JetStreamSettings) -> None:
    """Async :func:`mask_settings_secrets` (``amask_secret`` on Airflow 3: the sync form must not
    talk to the supervisor from inside an event loop)."""
    values = s.secret_values()
    if not values:
        return
    # lazy: compat resolves the masker of the installed Airflow on first use
    from airflow_provider_plgd.compat import amask_secret

    if amask_secret is None:  # pragma: no cover - Airflow 2.11 / older 3.x
        mask_settings_secrets(s)
        return
    for value in values:
        await amask_secret(value)


class JetStreamBaseHook(BaseHook):
    """The ``plgd_jetstream`` connection: settings, a client, the API client.

    :param jetstream_conn_id: Airflow connection id of type ``plgd_jetstream``.
    :param stream: stream name; default: the connection's ``stream`` extra, else ``EVENTS``.

    Every role's public method raises :class:`~airflow_provider_plgd.exceptions.JetStreamError`
    subclasses for server-side problems (connection, auth, JetStream disabled, missing stream,
    API errors, timeouts) and ``ValueError``/``TypeError`` for bad arguments. Credentials are
    never logged; logs name the servers only.
    """

    conn_name_attr = "jetstream_conn_id"
    default_conn_name = "plgd_jetstream_default"
    conn_type = CONN_TYPE
    hook_name = "plgd JetStream"

    def __init__(self, jetstream_conn_id: str = default_conn_name, *, stream: str | None = None) -> None:
        super().__init__()
        self.jetstream_conn_id = jetstream_conn_id
        self._stream_override = stream
        self._settings: JetStreamSettings | None = None

    @classmethod
    def from_settings(cls, settings: JetStreamSettings) -> Self:
        """A hook on ``settings`` instead of an Airflow connection (command-line tools,
        ``plgd-etl status --servers``): nothing is looked up, no secret is registered."""
        hook = cls(stream=settings.stream)
        hook._settings = settings
        return hook

    # ---- settings & connection ----------------------------------------------------------

    def get_settings(self) -> JetStreamSettings:
        """Read the Airflow connection once (sync) and return :class:`JetStreamSettings`.

        Registers every secret of the connection with Airflow's log masker (see
        :func:`mask_settings_secrets`).
        """
        if self._settings is None:
            conn = self.get_connection(self.jetstream_conn_id)
            settings = settings_from_connection(conn, self._stream_override)
            mask_settings_secrets(settings)
            self._settings = settings
        return self._settings

    async def aget_settings(self) -> JetStreamSettings:
        """Async :meth:`get_settings` (uses ``aget_connection`` and ``amask_secret`` on Airflow 3,
        which must not be replaced by the sync forms inside an event loop)."""
        if self._settings is None:
            conn = await self._aget_connection()
            settings = settings_from_connection(conn, self._stream_override)
            await amask_settings_secrets(settings)
            self._settings = settings
        return self._settings

    async def _aget_connection(self) -> Any:
        """The Airflow connection, looked up without blocking the event loop.

        Airflow 3: ``aget_connection`` first. When it says the connection "isn't defined", the sync
        lookup runs in a worker thread and its answer is used: under ``dag.test()`` /
        ``airflow dags test`` the task's in-process supervisor link has no async ``asend``
        (Task SDK 1.x ``InProcessSupervisorComms``), so the async lookup of a connection stored in
        the metadata DB fails, silently, while the sync lookup in the same task finds it. When both
        fail, the async lookup's error is raised.
        Airflow 2: the sync lookup.
        """
        aget = getattr(self, "aget_connection", None)
        if aget is None:
            return self.get_connection(self.jetstream_conn_id)
        try:
            return await aget(self.jetstream_conn_id)
        except Exception as exc:
            if type(exc).__name__ != "AirflowNotFoundException":
                raise
            try:
                conn = await asyncio.to_thread(self.get_connection, self.jetstream_conn_id)
            except Exception:  # the async lookup's error is the one to report
                raise exc from None
            self.log.debug("Connection %s found by the sync lookup after the async one did not find it",
                           self.jetstream_conn_id)
            return conn

    @property
    def stream(self) -> str:
        """The stream name in use (argument, else connection extra ``stream``, else ``EVENTS``).

        :raises ValueError: the argument is not a valid stream name (``jetstream.connection.check_stream_name``).
        """
        return check_stream_name(self._stream_override) if self._stream_override else self.get_settings().stream

    @contextlib.asynccontextmanager
    async def aconnect(self) -> AsyncIterator[Any]:
        """Connect to the first reachable server and yield the nats-py client; close it on exit
        (:func:`~airflow_provider_plgd.jetstream.client.connect`: errors, TLS guard).

        A bare nats-py error raised while the client is in use (e.g. ``ConnectionClosedError``
        when the server goes away) becomes :class:`JetStreamConnectionError` naming the stream.
        """
        # lazy: nats loads when a task talks to the server, not when a DAG file is parsed
        import nats.errors

        s = await self.aget_settings()
        async with connect(s, self.jetstream_conn_id) as nc:
            try:
                yield nc
            except nats.errors.Error as exc:
                raise JetStreamConnectionError(
                    f"connection to NATS lost while reading stream {s.stream!r} ({type(exc).__name__}: {exc}); "
                    "nothing was committed for the batch in progress, retry the task"
                ) from exc

    def api(self, nc: Any) -> JetStreamApi:
        """The JetStream API client (:mod:`.api`: requests, errors, consumers) over the open client ``nc``."""
        s = self._settings
        return JetStreamApi(nc, s.safe_servers() if s else "NATS", self.log)


def check_bounds(start_time: Any, end_time: Any, start_seq: Any,
                 end_seq: Any) -> tuple[int | None, int | None, int | None, int | None]:
    """``(start_ns, end_ns, start_seq, end_seq)`` of a read's or count's bounds: times as unix ns
    (timezone-aware ``datetime`` or int ns), sequences as given.

    :raises ValueError/TypeError: a time that is neither, or a sequence that is not an int >= 1.
    """
    start_ns = to_ns(start_time, "start_time", text=False) if start_time is not None else None
    end_ns = to_ns(end_time, "end_time", text=False) if end_time is not None else None
    for name, v in (("start_seq", start_seq), ("end_seq", end_seq)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    return start_ns, end_ns, start_seq, end_seq


def connection_storage_root(jetstream_conn_id: str) -> str | None:
    """The ``storage_root`` extra of the connection, or None (also when the connection is missing
    or invalid: that surfaces when the stream is read). The one place that reads it: ``tables/``
    is given the value (``Layout.resolve``, ``storage_root.resolve_storage_root``)."""
    try:
        return JetStreamBaseHook(jetstream_conn_id=jetstream_conn_id).get_settings().storage_root or None
    except Exception:  # connection missing or invalid: fall back to AIRFLOW_HOME
        return None


def resolve_layout(value: str | None, jetstream_conn_id: str) -> Layout:
    """The layout of the storage root ``value``, else of the connection's ``storage_root`` extra
    (:func:`connection_storage_root`, looked up only when ``value`` is empty), else of
    ``$AIRFLOW_HOME/plgd`` (``Layout.resolve``).

    :param value: an explicit root, or ``""``/None for the defaults.
    :param jetstream_conn_id: the ``plgd_jetstream`` connection whose extra is the next default.
    :raises ValueError: a root that is refused (the message names it).
    """
    return Layout.resolve(value, None if value else connection_storage_root(jetstream_conn_id))
