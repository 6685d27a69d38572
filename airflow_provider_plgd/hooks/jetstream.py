"""Airflow hook for the plgd hub's NATS JetStream stream (connection type ``plgd_jetstream``).

Reads plgd events from a JetStream stream (default ``EVENTS`` on ``plgd.>``, docs/wire-format.md §1.5)
in bounded, server-side-filtered batches, counts and lists them cheaply, publishes, and opens the
durable consumer of the fetch operator's durable mode. All NATS access of the provider goes
through the hooks. :class:`JetStreamHook` has every role; each role is a hook of its own, like
the Kafka provider's admin, consumer and producer hooks:

- :mod:`~airflow_provider_plgd.hooks.base`: :class:`JetStreamBaseHook`, the connection (settings,
  form, client), shared by the roles;
- :mod:`~airflow_provider_plgd.hooks.info`: :class:`JetStreamInfoHook`, stream info, interval
  completeness, subjects and owners, exact counts;
- :mod:`~airflow_provider_plgd.hooks.consume`: :class:`JetStreamConsumeHook`, bounded reads and
  the durable consumer;
- :mod:`~airflow_provider_plgd.hooks.produce`: :class:`JetStreamProduceHook`, publish.

Below them, without Airflow (the Spark data source uses them on executors):
:mod:`~airflow_provider_plgd.jetstream.connection` (settings, checks, opening a client),
:mod:`~airflow_provider_plgd.jetstream.api` (the one JetStream API client: requests, errors, consumers,
pulls, acks, publish), :mod:`~airflow_provider_plgd.jetstream.counting`,
:mod:`~airflow_provider_plgd.jetstream.pull`, :mod:`~airflow_provider_plgd.jetstream.durable`,
:mod:`~airflow_provider_plgd.jetstream.messages`; :mod:`~airflow_provider_plgd.jetstream.blocking` builds
every sync method from its async one.
"""

from __future__ import annotations

import json
from typing import Any

from airflow_provider_plgd.exceptions import (
    JetStreamAPIError,
    JetStreamAuthError,
    JetStreamConnectionError,
    JetStreamError,
    JetStreamNotEnabledError,
    JetStreamTimeoutError,
    StreamNotFoundError,
)
from airflow_provider_plgd.get_provider_info import CONN_FIELDS, UI_FIELD_BEHAVIOUR
from airflow_provider_plgd.hooks.base import JetStreamBaseHook
from airflow_provider_plgd.hooks.consume import JetStreamConsumeHook
from airflow_provider_plgd.hooks.info import JetStreamInfoHook
from airflow_provider_plgd.hooks.produce import JetStreamProduceHook
from airflow_provider_plgd.jetstream.api import page_subjects
from airflow_provider_plgd.jetstream.messages import StreamMessage
from airflow_provider_plgd.jetstream.pull import DEFAULT_BATCH_SIZE

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "JetStreamAPIError",
    "JetStreamAuthError",
    "JetStreamBaseHook",
    "JetStreamConnectionError",
    "JetStreamConsumeHook",
    "JetStreamError",
    "JetStreamHook",
    "JetStreamInfoHook",
    "JetStreamNotEnabledError",
    "JetStreamProduceHook",
    "JetStreamTimeoutError",
    "StreamMessage",
    "StreamNotFoundError",
    "page_subjects",
]


class JetStreamHook(JetStreamInfoHook, JetStreamConsumeHook, JetStreamProduceHook):
    """Access the plgd hub's JetStream stream: every role of the hooks on one connection.

    Stream info, completeness, subject/owner listing and counting (:class:`JetStreamInfoHook`),
    bounded batched reading and durable consumers (:class:`JetStreamConsumeHook`), publishing
    (:class:`JetStreamProduceHook`); the connection (:class:`JetStreamBaseHook`) is the one
    registered for the connection type ``plgd_jetstream``: it describes the connection form
    (Airflow 2.11's ``ProvidersManager`` reads the form and UI metadata only from the registered
    class's own attributes, never inherited ones).

    :param jetstream_conn_id: Airflow connection id of type ``plgd_jetstream``.
    :param stream: stream name; default: the connection's ``stream`` extra, else ``EVENTS``.

    Bounds: ``[start_time, end_time)`` by JetStream server timestamp (timezone-aware ``datetime``
    or int unix ns) and ``[start_seq, end_seq]`` by stream sequence; both are combined with AND,
    and reading never goes past the stream's last sequence taken when the call starts.
    Every public method raises :class:`~airflow_provider_plgd.exceptions.JetStreamError`
    subclasses for server-side problems and ``ValueError``/``TypeError`` for bad arguments.
    Credentials are never logged; logs name the servers only.
    """

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        """Extra fields for the connection form of Airflow < 3.2 (from ``CONN_FIELDS``).

        Returns ``{}`` when flask_appbuilder/wtforms are not importable (Airflow 3 without the
        FAB provider reads ``conn-fields`` from the provider info instead).
        """
        # lazy: the FAB UI packages exist only where the old connection form is served
        try:
            from flask_appbuilder.fieldwidgets import BS3PasswordFieldWidget, BS3TextFieldWidget
            from flask_babel import lazy_gettext
            from wtforms import PasswordField, StringField
        except ImportError:
            return {}
        widgets: dict[str, Any] = {}
        for name, spec in CONN_FIELDS.items():
            schema = spec.get("schema", {})
            secret = schema.get("format") == "password"
            field_cls, widget = (PasswordField, BS3PasswordFieldWidget) if secret else (StringField, BS3TextFieldWidget)
            widgets[name] = field_cls(
                lazy_gettext(spec["label"]),
                description=spec.get("description", ""),
                widget=widget(),
                default=schema.get("default"),
            )
        return widgets

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """Hidden/relabelled fields and placeholders of the connection form.

        :return: ``{"hidden_fields": [str], "relabeling": {field: label}, "placeholders": {field: text}}``,
            the hook API's snake_case keys (Airflow's ``ProvidersManager`` validates them; the provider
            info's ``ui-field-behaviour`` keeps the kebab-case ``hidden-fields`` of
            ``provider_info.schema.json``). Source: ``get_provider_info.UI_FIELD_BEHAVIOUR``.
        """
        behaviour = json.loads(json.dumps(UI_FIELD_BEHAVIOUR))
        return {
            "hidden_fields": behaviour["hidden-fields"],
            "relabeling": behaviour["relabeling"],
            "placeholders": behaviour["placeholders"],
        }
