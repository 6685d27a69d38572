"""The pipeline's metrics through Airflow's own ``Stats``, caught by a StatsD listener on loopback
(``[metrics] statsd_on``, with ``statsd_influxdb_enabled`` so that the tags travel), and the chain
monitor's alert (``etl.monitor``).

* The interval counters of a real ETL run (``plgd.interval.*``, sent by its ``summary`` task) are
  checked by ``test_ui_page.py``, whose chain's first interval is one (``airflow dags test``, real
  nats-server, Spark Connect, a payload that cannot be decoded, duplicates), with
  :func:`check_interval_metrics`: one run of Spark serves the page and the metrics.
* The monitor DAG (``dag.test()``) on the chain with a hole of ``test_ui_page.py``: its task fails
  (``ChainUnhealthyError``: what Airflow's failure callbacks react to) and sends ``plgd.chain.*``
  gauges equal to the chain's holes, failed intervals and lag (read with nats-py).

Each test starts as a fresh ``dag.test()`` process does: nothing has set Airflow's metrics up, so
the provider does it from ``[metrics]`` (``etl.metrics.stats``), as Airflow's task runner does.
"""

from __future__ import annotations

import json
import time

import pytest

from airflow_provider_plgd import times
from plgd_devtools.otlp_listener import OtlpListener
from plgd_devtools.statsd_listener import StatsdListener
from tests.integration.conftest import load_test_dag, read_stream
from tests.integration.test_status import HOUR

pytestmark = [pytest.mark.airflow]
pytest.importorskip("airflow.sdk", reason="Airflow 3 (Airflow 2.11: tests/airflow2)")


def _fresh_metrics(monkeypatch, settings: dict[str, str]) -> None:
    """``[metrics]`` from ``settings``, in a process where nothing set the metrics up yet."""
    from airflow.sdk._shared.observability.metrics import stats as shared

    for key, value in settings.items():
        monkeypatch.setenv(f"AIRFLOW__METRICS__{key}", value)
    monkeypatch.setattr(shared, "_factory", None)
    monkeypatch.setattr(shared, "_backend", None)


@pytest.fixture
def statsd(monkeypatch):
    import importlib.util

    assert importlib.util.find_spec("statsd"), "Airflow's StatsD client `statsd` is missing: pip install -e '.[dev]'"
    listener = StatsdListener()
    _fresh_metrics(monkeypatch, {"STATSD_ON": "True", "STATSD_HOST": "127.0.0.1", "STATSD_PORT": str(listener.port),
                                 "STATSD_PREFIX": "airflow", "STATSD_INFLUXDB_ENABLED": "True", "OTEL_ON": "False"})
    try:
        yield listener
    finally:
        listener.stop()


@pytest.fixture
def otlp(monkeypatch):
    """Airflow's OpenTelemetry metrics (``[metrics] otel_on``, OTLP over HTTP) to a receiver on loopback."""
    import opentelemetry.metrics._internal as otel_internal
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider

    listener = OtlpListener()
    for key in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_METRICS_EXPORTER"):
        monkeypatch.delenv(key, raising=False)  # Airflow prefers them to [metrics] otel_host/otel_port
    _fresh_metrics(monkeypatch, {"OTEL_ON": "True", "STATSD_ON": "False", "OTEL_HOST": "127.0.0.1",
                                 "OTEL_PORT": str(listener.port), "OTEL_PREFIX": "airflow",
                                 "OTEL_INTERVAL_MILLISECONDS": "60000"})
    try:
        yield listener
    finally:
        metrics.get_meter_provider().shutdown()  # type: ignore[attr-defined]  # the SDK's provider Airflow set
        # Airflow's exit hook flushes the global provider: leave it one without readers (the same
        # private global Airflow's get_otel_logger resets), not the one shut down above
        otel_internal._METER_PROVIDER = MeterProvider(shutdown_on_exit=False)
        listener.stop()


def _caught(listener) -> dict[str, tuple[float, str, dict]]:
    """What ``listener`` caught under ``plgd.``, the kinds as StatsD names them (``c``, ``g``)."""
    if isinstance(listener, OtlpListener):
        from opentelemetry import metrics

        metrics.get_meter_provider().force_flush()  # type: ignore[attr-defined]  # export now, not in 60 s
        kinds = {"sum": "c", "gauge": "g"}
        return {k: (v, kinds.get(kind, kind), tags) for k, (v, kind, tags) in listener.metrics().items()}
    return listener.metrics()


def check_interval_metrics(got: dict, summary: dict, stored: int, *, dag_id: str) -> None:
    """``got`` (a listener's ``metrics()``) holds the ``plgd.interval.*`` counters of one ETL run whose
    ``summary`` task returned ``summary``, over an interval the stream held ``stored`` messages for
    (read with nats-py), one of them no plgd event, some of them duplicates; tagged ``dag_id``."""
    tags = {"dag_id": dag_id, "stream": "EVENTS"}
    expected = {"plgd.interval.fetched": stored, "plgd.interval.decoded": summary["decode"]["decoded"],
                "plgd.interval.quarantined": 1,
                **{f"plgd.interval.quarantined_reason.{r}": n for r, n in summary["decode"]["per_reason"].items()},
                "plgd.interval.kept": summary["dedupe"]["output"],
                "plgd.interval.duplicates": summary["dedupe"]["duplicates"]}
    assert {k: (got[k][0], got[k][1]) for k in expected if k in got} == {k: (v, "c") for k, v in expected.items()}, got
    assert got["plgd.interval.duplicates"][0] > 0 and got["plgd.interval.fetched"][0] == summary["fetched_total"]
    assert got["plgd.interval.decoded"][0] + 1 == stored
    assert got["plgd.interval.kept"][0] + got["plgd.interval.duplicates"][0] == got["plgd.interval.decoded"][0]
    assert got["plgd.interval.fetched"][2] == tags
    (reason,) = summary["decode"]["per_reason"]  # the one message that is no plgd event
    assert got[f"plgd.interval.quarantined_reason.{reason}"][2] == {**tags, "reason": reason}
    assert got["plgd.interval.lag_seconds"][1] == "g" and 0 < got["plgd.interval.lag_seconds"][0] < 600


MONITOR_DAG_FILE = """
from datetime import datetime, timezone
from airflow_provider_plgd.etl.monitor import build_monitor_dag

dag = build_monitor_dag(dag_id="plgd_metrics_monitor", etl_dag_id="plgd_events_etl", storage_root=ROOT,
                        start_date=datetime(2026, 1, 1, tzinfo=timezone.utc))
"""


@pytest.mark.parametrize("backend", ["statsd", "otlp"])
def test_the_monitor_fails_on_a_hole_and_sends_the_chain_gauges(jetstream, dags_folder, tmp_path, backend, request):
    """Through StatsD, and through OpenTelemetry (OTLP over HTTP, ``[metrics] otel_on``): the same
    names (``airflow.plgd.chain.*``), values and tags (attributes)."""
    from tests.integration.test_ui_page import _chain

    listener = request.getfixturevalue(backend)

    root = str(tmp_path / "root")
    start_ns = (time.time_ns() // HOUR - 8) * HOUR
    chain = _chain(root, jetstream.url, start_ns)
    behind = [seq for seq in read_stream(jetstream.url) if seq >= chain["ranges"][3][1]]
    dag = load_test_dag(dags_folder, "plgd_metrics_monitor", MONITOR_DAG_FILE.replace("ROOT", json.dumps(root)),
                        "plgd_metrics_monitor")
    run = dag.test()
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    assert "failed" in states["check_chain"].lower(), states  # the alert: failure callbacks fire
    got = _caught(listener)
    expected = {"plgd.chain.holes": 1, "plgd.chain.failed": 1, "plgd.chain.stale": 0, "plgd.chain.committed": 3,
                "plgd.chain.lag_messages": len(behind)}
    assert {k: got[k][0] for k in expected if k in got} == expected, got
    assert got["plgd.chain.problems"][0] >= 2 and got["plgd.chain.holes"][1] == "g"
    assert got["plgd.chain.holes"][2] == {"dag_id": "plgd_events_etl", "stream": "EVENTS"}
    head_end = times.Interval.from_id(chain["ids"][3]).end_ns / 1e9
    assert abs(got["plgd.chain.lag_seconds"][0] - (time.time() - head_end)) < 120  # messages published just now
