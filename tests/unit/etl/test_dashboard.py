"""docs/grafana-plgd-dashboard.json queries the metrics the pipeline sends, under the names Prometheus
gives them on both paths docs/metrics.md describes:

* StatsD -> ``statsd_exporter`` (its default mapping): ``airflow.plgd.chain.holes`` becomes
  ``airflow_plgd_chain_holes`` (dots to ``_``), a counter gets ``_total``, the InfluxDB-style tags
  become labels;
* OpenTelemetry -> Prometheus (the collector's ``prometheus`` exporter, Prometheus' OTLP receiver):
  the same names (dots to ``_``; a monotonic sum, our counters, gets ``_total``; no unit is set, so
  no unit suffix), the attributes become labels.

The names come from their one home, ``etl.metrics``."""

from __future__ import annotations

import json
import re
from pathlib import Path

from airflow_provider_plgd.etl import metrics

DASHBOARD = Path(__file__).resolve().parents[3] / "docs" / "grafana-plgd-dashboard.json"
AIRFLOW_PREFIX = "airflow"  # [metrics] statsd_prefix / otel_prefix default
#: The tags the pipeline sends (docs/metrics.md), which become Prometheus labels.
TAGS = {"dag_id", "stream", "reason"}
#: Labels Prometheus adds itself (or the dashboard's template needs).
PROMETHEUS_LABELS = {"__name__", "job", "instance"}


def prometheus_name(name: str, *, counter: bool) -> str:
    """The Prometheus name of our metric ``name`` (module docstring)."""
    flat = f"{AIRFLOW_PREFIX}.{name}".replace(".", "_")
    return flat + "_total" if counter else flat


def emitted() -> dict[str, str]:
    """``{Prometheus name or pattern: our name}`` of every metric the pipeline sends."""
    counters = {prometheus_name(n, counter=True): n for n in metrics.INTERVAL_COUNTERS}
    gauges = {prometheus_name(n, counter=False): n for n in (*metrics.CHAIN_GAUGES, metrics.INTERVAL_LAG)}
    reason = prometheus_name(metrics.QUARANTINED_BY_REASON, counter=False) + "_.+_total"
    return {**counters, **gauges, reason: metrics.QUARANTINED_BY_REASON + ".<reason>"}


def queries() -> list[str]:
    """Every PromQL expression of the dashboard: its panels' targets and its template variables."""
    board = json.loads(DASHBOARD.read_text())
    found = [t["expr"] for p in board["panels"] for t in p.get("targets", ()) if t.get("expr")]
    for variable in board.get("templating", {}).get("list", ()):
        query = variable.get("query")
        if isinstance(query, dict) and query.get("query"):
            found.append(query["query"])
    return found


def queried_names(expr: str) -> set[str]:
    """The metric names (or ``__name__=~`` patterns) that ``expr`` reads."""
    names = set(re.findall(r'__name__=~"([^"]+)"', expr))
    without_patterns = re.sub(r'__name__=~"[^"]+"', "", expr)
    without_strings = re.sub(r'"[^"]*"', '""', without_patterns)
    return names | set(re.findall(rf"\b{AIRFLOW_PREFIX}_[A-Za-z0-9_]+", without_strings))


def test_every_metric_the_dashboard_queries_is_one_we_send():
    ours = emitted()
    read = set().union(*(queried_names(e) for e in queries()))
    assert read, "no metric found in the dashboard's queries"
    assert read - set(ours) == set(), f"the dashboard queries metrics the pipeline does not send: {read - set(ours)}"


def test_every_metric_we_send_is_on_the_dashboard():
    read = set().union(*(queried_names(e) for e in queries()))
    assert set(emitted()) - read == set(), f"metrics missing from the dashboard: {set(emitted()) - read}"


def test_the_dashboard_filters_and_groups_by_our_tags_only():
    labels = set()
    for expr in queries():
        labels |= set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"", expr))
        for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
            labels |= {g.strip() for g in group.split(",") if g.strip()}
        labels |= set(re.findall(r"label_values\([^,]+,\s*([A-Za-z_]+)\)", expr))
    assert labels, "no label found in the dashboard's queries"
    assert labels - TAGS - PROMETHEUS_LABELS == set(), labels


def test_the_names_follow_the_exporters_rules():
    assert prometheus_name("plgd.chain.holes", counter=False) == "airflow_plgd_chain_holes"
    assert prometheus_name("plgd.interval.fetched", counter=True) == "airflow_plgd_interval_fetched_total"
    assert queried_names('sum(increase({__name__=~"a_.+_total", dag_id=~"airflow_x"}[1h])) + airflow_y{}') == \
        {"a_.+_total", "airflow_y"}
