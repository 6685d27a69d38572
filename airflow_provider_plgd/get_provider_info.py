"""Provider metadata read by Airflow's ProvidersManager.

Registered through the ``apache_airflow_provider`` entry point in ``setup.cfg``. Airflow checks
that ``package-name`` equals the installed distribution name. The connection fields are declared
the Airflow 3.2+ way (``conn-fields``, secrets with ``format: password``); the hook keeps
``get_connection_form_widgets``/``get_ui_field_behaviour`` for older Airflow. ``format: password``
only masks the input box: the UI and the REST API redact an extra's value only when its name
contains a word of Airflow's ``DEFAULT_SENSITIVE_FIELDS`` (``token``, ``secret``, ...), so every
secret extra here has such a name (``token``, ``nkey_seed_secret``).
Source: Airflow docs, "Community Providers > How to create your own provider" and
``provider_info.schema.json``.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_plgd import DISTRIBUTION_NAME, __version__

# The connection type and its fields have their one home with the connection settings (no Airflow there).
from airflow_provider_plgd.jetstream.connection import CONN_FIELDS, CONN_TYPE, NKEY_SEED_EXTRA  # noqa: F401

HOOK_CLASS = "airflow_provider_plgd.hooks.jetstream.JetStreamHook"
#: Standard fields of the form. Airflow 3 shows placeholders of the standard fields (host, port,
#: login, password) only; the extra fields' hints are in their ``description`` (``CONN_FIELDS``).
#: The ``servers``/``stream`` placeholders are for the Airflow 2.11 form.
UI_FIELD_BEHAVIOUR: dict[str, Any] = {
    "hidden-fields": ["schema", "extra"],
    "relabeling": {"login": "User", "password": "Password", "host": "Host (one NATS server)"},
    "placeholders": {
        "host": "nats.example.internal or tls://nats.example.internal",
        "port": "4222",
        "login": "user of the NATS account (optional)",
        "servers": "tls://nats-1:4222,tls://nats-2:4222",
        "stream": "EVENTS",
    },
}


#: Operator extra links (``airflow_provider_plgd.operators.links``); Airflow 2.11 deserializes a task's links
#: only from classes listed here (or in a plugin).
EXTRA_LINKS = (
    "airflow_provider_plgd.operators.links.PlgdSparkApplicationLink",
    "airflow_provider_plgd.operators.links.PlgdTablesLink",
)


def get_provider_info() -> dict[str, Any]:
    """Return the provider description that Airflow's ProvidersManager loads.

    :return: a dict following Airflow's ``provider_info.schema.json``: ``package-name`` (the
        distribution name), hooks, operators, sensors, triggers, connection types, the
        ``nats`` message queue for the common.messaging provider and the operator extra links.
    """
    return {
        "package-name": DISTRIBUTION_NAME,
        "name": "plgd",
        "description": "Fetch plgd hub events from NATS JetStream and turn them into tables with Spark.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "plgd JetStream",
                "external-doc-url": "https://github.com/plgd-dev/hub",
                "tags": ["protocol"],
            }
        ],
        "hooks": [
            {
                "integration-name": "plgd JetStream",
                "python-modules": [
                    "airflow_provider_plgd.hooks.base",
                    "airflow_provider_plgd.hooks.info",
                    "airflow_provider_plgd.hooks.consume",
                    "airflow_provider_plgd.hooks.produce",
                    "airflow_provider_plgd.hooks.jetstream",
                ],
            }
        ],
        "operators": [
            {
                "integration-name": "plgd JetStream",
                "python-modules": [
                    "airflow_provider_plgd.operators.jetstream_to_staging",
                    "airflow_provider_plgd.operators.ledger_range_fetch",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "plgd JetStream",
                "python-modules": ["airflow_provider_plgd.sensors.interval_complete"],
            }
        ],
        "triggers": [
            {
                "integration-name": "plgd JetStream",
                "python-modules": [
                    "airflow_provider_plgd.triggers.interval_complete",
                    "airflow_provider_plgd.triggers.messages",
                ],
            }
        ],
        "connection-types": [
            {
                "hook-class-name": HOOK_CLASS,
                "hook-name": "plgd JetStream",
                "connection-type": CONN_TYPE,
                "ui-field-behaviour": UI_FIELD_BEHAVIOUR,
                "conn-fields": CONN_FIELDS,
            }
        ],
        "queues": ["airflow_provider_plgd.queues.nats.NatsMessageQueueProvider"],
        "extra-links": list(EXTRA_LINKS),
    }
