"""Secrets of the JetStream connection masked in Airflow task logs: a real DAG run (``dag.test()``
in a fresh process with a worker's logging) against a real NKEY ``nats-server``, and the secrets
the hook registers with Airflow's masker beyond Airflow's own sensitive names. The connection's
TLS, authentication and error messages: ``test_security.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from airflow_provider_plgd.hooks.jetstream import JetStreamHook
from plgd_devtools.nats_server import NatsServer, new_nkey, recreate_stream
from plgd_devtools.spark import spark_lock
from tests.integration.delta_read import staging_rows
from tests.integration.test_security import OWNER, PASSWORD, SMALL_STREAM, SUBJECT, TOKEN, set_conn

# ---------------------------------------------------------------------------------------------
# Airflow: secrets masked in task logs (a real DAG run with dag.test())

MASK_DAG = """
from airflow.sdk import DAG, task
from airflow_provider_plgd.hooks.jetstream import JetStreamHook
from airflow_provider_plgd.operators.jetstream_to_staging import JetStreamToStagingOperator

with DAG("plgd_test_secrets_masked", schedule=None, catchup=False) as dag:
    @task
    def careless_user_code():
        # what a careless DAG author might do: log every secret of the connection
        hook = JetStreamHook()
        settings = hook.get_settings()
        conn = hook.get_connection("plgd_jetstream_default")
        hook.log.info("LOGGED password=%s", conn.password)
        hook.log.info("LOGGED token=%s", settings.token)
        hook.log.info("LOGGED nkey_seed=%s", settings.nkey_seed)
        hook.log.info("LOGGED extras=%s", conn.extra_dejson)
        return hook.stream_info()["state"]["messages"]

    fetch = JetStreamToStagingOperator(task_id="fetch", owner_id="OWNER", event_type="devicesregistered",
                                       start_seq=1, storage_root="ROOT")
    careless_user_code() >> fetch
"""

#: Runs the DAG file with ``dag.test()`` in a fresh process whose logging is configured the way
#: Airflow configures a worker's task supervisor (``airflow.sdk.log.configure_logging``: secrets
#: masked in every log line). The pytest process keeps its own logging setup untouched.
MASK_RUNNER = """
import importlib.util, sys
from airflow.sdk.log import configure_logging
configure_logging()
spec = importlib.util.spec_from_file_location("plgd_test_secrets_masked", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
dr = module.dag.test()
print("DAG RUN STATE", dr.state)
"""


@pytest.mark.airflow
def test_connection_secrets_are_masked_in_airflow_task_logs(dags_folder, tmp_path, monkeypatch):
    seed, public = new_nkey("user")
    # An NKEY server: it authenticates by the seed and ignores the password and token the client
    # also sends -- so one connection carries every kind of secret.
    with NatsServer(config=f'authorization {{ users = [ {{nkey: "{public}"}} ] }}\n') as server:
        recreate_stream(server.url, SMALL_STREAM, nkeys_seed_str=seed)
        set_conn(monkeypatch, login="etl", password=PASSWORD, extra={
            "servers": f"nats://127.0.0.1:{server.port}",
            "token": TOKEN, "nkey_seed_secret": seed, "stream": "EVENTS"})
        JetStreamHook().publish(SUBJECT, b"x")
        root = tmp_path / "root"
        path = dags_folder / "plgd_test_secrets_masked.py"
        path.write_text(MASK_DAG.replace("OWNER", OWNER).replace("ROOT", str(root)))
        runner = tmp_path / "run_dag.py"
        runner.write_text(MASK_RUNNER)
        # a DAG run on the shared CI machine takes a Spark slot (one heavy job per worker): any free
        # slot (spark_lock), not the first one (flock /tmp/spark.lock), which the other xdist worker
        # may hold for minutes
        with spark_lock():
            proc = subprocess.run([sys.executable, str(runner), str(path)],
                                  capture_output=True, text=True, timeout=1800, env=dict(os.environ))
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "DAG RUN STATE success" in text, text[-3000:]
    # the careless lines ran and were masked, and the fetch task (which logs too) committed the batch
    for label in ("password", "token", "nkey_seed"):
        assert f"LOGGED {label}=***" in text
    assert "Reading plgd.owners." in text  # the hook's own log lines are in the output as well
    for secret in (PASSWORD, TOKEN, seed):
        assert secret not in text
    assert [r["owner_id"] for r in staging_rows(root)] == [OWNER]


def test_hook_masks_the_secrets_airflow_alone_does_not(monkeypatch):
    """Airflow masks the password and extras with a sensitive name (``token``,
    ``nkey_seed_secret``) when a connection is read, not the former ``nkey_seed`` extra; the hook
    registers that one too."""
    from airflow.sdk import BaseHook
    from airflow.sdk.log import redact

    tag = os.urandom(4).hex()  # fresh values: the masker is process-global
    password, token = f"pw-{tag}-a", f"tok-{tag}-b"
    seed, _public = new_nkey("user")
    set_conn(monkeypatch, login="etl", password=password, extra={
        "servers": "nats://127.0.0.1:4222", "token": token, "nkey_seed_secret": seed})
    conn = BaseHook.get_connection("plgd_jetstream_default")
    assert conn.extra_dejson["nkey_seed_secret"] == seed
    assert redact(f"{password} {token} {seed}") == "*** *** ***"  # Airflow alone, with the current names
    old_seed, _public = new_nkey("user")
    set_conn(monkeypatch, login="etl", password=password, extra={"servers": "nats://127.0.0.1:4222",
                                                                "nkey_seed": old_seed})
    conn = BaseHook.get_connection("plgd_jetstream_default")
    assert conn.extra_dejson["nkey_seed"] == old_seed
    assert redact(old_seed) == old_seed  # Airflow alone: the former name is not sensitive
    JetStreamHook().get_settings()
    assert redact(old_seed) == "***"  # after the hook read the connection
