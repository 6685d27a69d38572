"""The ``plgd_jetstream`` connection form as Airflow 3 serves it to the UI (``GET /ui/connections/hook_meta``,
built by ``HookMetaService``): hints where Airflow 3 shows them, and the connection type's URI round trip."""

from __future__ import annotations

import pytest

airflow3 = pytest.importorskip("airflow.api_fastapi", reason="the Airflow 3 UI API")


def _meta():
    from airflow.api_fastapi.core_api.services.ui.connections import HookMetaService

    return next(h for h in HookMetaService.hook_meta_data() if h.connection_type == "plgd_jetstream")


def test_hints_are_where_airflow3_shows_them():
    meta = _meta()
    # standard fields: Airflow 3 shows their placeholders
    assert meta.standard_fields.host.placeholder.startswith("nats.example.internal")
    assert meta.standard_fields.port.placeholder == "4222"
    assert meta.standard_fields.url_schema.hidden is True
    # extra fields: Airflow 3 shows the description (no placeholder), so the examples are in it
    servers = meta.extra_fields["servers"]["description"]
    for scheme in ("nats://", "tls://", "ws://", "wss://"):
        assert scheme in servers
    assert "e.g. tls://nats-1:4222,tls://nats-2:4222" in servers
    assert "EVENTS" in meta.extra_fields["stream"]["description"]
    assert meta.extra_fields["stream"]["value"] == "EVENTS"
    assert "s3://" in meta.extra_fields["storage_root"]["description"]
    assert "s3a://bucket" not in meta.extra_fields["storage_root"]["description"]


def test_secret_extra_fields_are_password_inputs():
    """The Add form types the token and the NKEY seed into password inputs (``format: password``;
    the browser test checks the rendered ``<input type=password>``); the others stay readable."""
    from airflow_provider_plgd.jetstream.connection import NKEY_SEED_EXTRA

    fields = _meta().extra_fields
    secret = {name for name, field in fields.items() if field["schema"].get("format") == "password"}
    assert secret == {"token", NKEY_SEED_EXTRA}
    assert "NKEY seed" in fields["servers"]["description"]  # where the credentials go instead of the URL


def test_connection_type_with_underscore_round_trips_through_its_uri():
    """Airflow's core ``Connection.get_uri`` warns for every type with ``_`` (its own
    ``google_cloud_platform`` too) and writes ``plgd-jetstream://``, which it parses back to
    ``plgd_jetstream``: existing connections keep working, so the type is not renamed."""
    from airflow.models.connection import Connection

    conn = Connection(conn_id="x", conn_type="plgd_jetstream", host="nats.example.internal", port=4222,
                      extra={"stream": "EVENTS"})
    uri = conn.get_uri()  # logs "Connection schemes (type: plgd_jetstream) shall not contain '_'"
    assert uri.startswith("plgd-jetstream://nats.example.internal:4222")
    back = Connection(conn_id="x", uri=uri)
    assert back.conn_type == "plgd_jetstream" and back.extra_dejson == {"stream": "EVENTS"}
