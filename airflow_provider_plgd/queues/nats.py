"""The ``nats`` scheme for the common.messaging provider's ``MessageQueueTrigger``.

Registered in ``get_provider_info()["queues"]``; ``ProvidersManager`` loads it, and
``MessageQueueTrigger(scheme="nats", **kwargs)`` then resolves to
:class:`~airflow_provider_plgd.triggers.messages.JetStreamMessageTrigger` ``(**kwargs)``
(kwargs: ``subject_filter``, ``stream``, ``jetstream_conn_id``, ``poll_interval``, ``start_seq``).
Source: common.messaging provider, ``BaseMessageQueueProvider`` (scheme-based dispatch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.providers.common.messaging.providers.base_provider import BaseMessageQueueProvider

if TYPE_CHECKING:
    from airflow.triggers.base import BaseEventTrigger

#: The scheme this provider answers to.
NATS_SCHEME = "nats"


class NatsMessageQueueProvider(BaseMessageQueueProvider):
    """Scheme ``nats``: JetStream messages on a subject filter (:class:`JetStreamMessageTrigger`).

    The deprecated queue-URI dispatch (``MessageQueueTrigger(queue="nats://...")``) is not
    supported; use ``scheme="nats"`` with keyword arguments.
    """

    scheme = NATS_SCHEME

    def trigger_class(self) -> type[BaseEventTrigger]:
        """Return :class:`airflow_provider_plgd.triggers.messages.JetStreamMessageTrigger`."""
        # lazy: the provider manager loads queue providers at start; the trigger (and nats) when a watcher runs
        from airflow_provider_plgd.triggers.messages import JetStreamMessageTrigger

        return JetStreamMessageTrigger
