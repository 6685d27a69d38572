"""Shared test fixtures: a real nats-server with JetStream, and the plgd stream on it.

Airflow settings are fixed here, before anything imports airflow: AIRFLOW_HOME is a temp dir of
this test session (never the user's), examples off, unit-test mode on.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile

_AIRFLOW_HOME = tempfile.mkdtemp(prefix="plgd-test-airflow-home-")
atexit.register(shutil.rmtree, _AIRFLOW_HOME, ignore_errors=True)
os.environ["AIRFLOW_HOME"] = _AIRFLOW_HOME
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "True"

import pytest  # noqa: E402

from airflow_provider_plgd.testing.nats_server import NatsServer, recreate_stream  # noqa: E402


@pytest.fixture(scope="session")
def nats_server():
    """A ``nats-server -js`` on a free loopback port with a temp store (session scope).

    Attributes ``url``, ``host``, ``port``, ``store_dir``, ``pid``; ``stop()``/``start()`` restart
    it on the same port and store. Stopped by PID and its temp dir removed at teardown.
    """
    server = NatsServer()
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def jetstream(nats_server, monkeypatch):
    """Fresh stream ``EVENTS`` on ``plgd.>`` with the plgd bundle settings (WIRE_FORMAT.md §1.5),
    and ``AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT`` pointing at the server. Yields the server."""
    nats_server.start()  # no-op when running; a test may have stopped it
    recreate_stream(nats_server.url)
    monkeypatch.setenv(
        "AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT",
        json.dumps(
            {
                "conn_type": "plgd_jetstream",
                "host": nats_server.host,
                "port": nats_server.port,
                "extra": {"stream": "EVENTS"},
            }
        ),
    )
    yield nats_server
