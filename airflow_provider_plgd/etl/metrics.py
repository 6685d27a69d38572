"""The pipeline's metrics, sent through Airflow's own metrics (``Stats``: StatsD, Datadog or
OpenTelemetry, as ``[metrics]`` configures them). Names and tags: docs/metrics.md.

* :func:`emit_interval_metrics`: per interval, when the ``summary`` task reconciled it: messages
  fetched, decoded, quarantined (in all and per reason), kept and duplicates (counters), and the
  interval's lag (gauge);
* :func:`emit_chain_metrics`: the chain's state from the status view (``plgd-etl status``): holes,
  stale, failed and unfinished intervals, problems, the lag in messages and seconds (gauges); the
  monitor task sends them (:mod:`.monitor`).

Every name starts with :data:`PREFIX` (Airflow adds its own ``[metrics] statsd_prefix`` before it,
default ``airflow``). Tags: ``dag_id`` (the ETL DAG) and ``stream``, and ``reason`` on the
per-reason quarantine counter. Plain StatsD has no tags: Airflow sends them only with ``[metrics]
statsd_influxdb_enabled = True`` (InfluxDB-style ``name,tag=value``), with Datadog and with
OpenTelemetry (attributes); the per-reason counter carries the reason in its name too.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from airflow_provider_plgd.compat import AIRFLOW_V_3

log = logging.getLogger(__name__)

PREFIX = "plgd"
#: Counters of :func:`emit_interval_metrics`: metric name -> where in the summary (``app``, ``key``).
INTERVAL_COUNTERS: dict[str, tuple[str | None, str]] = {
    f"{PREFIX}.interval.fetched": (None, "fetched_total"),
    f"{PREFIX}.interval.decoded": ("decode", "decoded"),
    f"{PREFIX}.interval.quarantined": ("decode", "quarantined"),
    f"{PREFIX}.interval.kept": ("dedupe", "output"),
    f"{PREFIX}.interval.duplicates": ("dedupe", "duplicates"),
}
QUARANTINED_BY_REASON = f"{PREFIX}.interval.quarantined_reason"
INTERVAL_LAG = f"{PREFIX}.interval.lag_seconds"
#: Gauges of :func:`emit_chain_metrics`.
CHAIN_GAUGES = tuple(f"{PREFIX}.chain.{n}" for n in (
    "holes", "stale", "failed", "unfinished", "problems", "committed", "lag_messages", "lag_seconds"))
_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")


def stats() -> Any:
    """Airflow's ``Stats``. On Airflow 3 a process where nothing set the metrics up yet (``dag.test()``,
    the api-server's plugins) gets them from ``[metrics]`` as the task runner does."""
    # lazy: where Stats lives differs by Airflow version (2.11, 3.x releases); only a metrics call needs it
    try:
        if not AIRFLOW_V_3:
            raise ImportError("Airflow 2")
        from airflow.sdk._shared.observability.metrics import stats as shared
        from airflow.sdk.observability.metrics import stats_utils
        from airflow.sdk.observability.stats import Stats
    except ImportError:  # Airflow 2 and 3.x releases before the Task SDK's observability package
        from airflow.stats import Stats  # configured from [metrics] on first use

        return Stats

    if getattr(shared, "_factory", True) is None:  # the task runner's stats.initialize did not run here
        from airflow.sdk.configuration import conf

        shared.initialize(factory=stats_utils.get_stats_factory(),
                          export_legacy_names=conf.getboolean("metrics", "legacy_names_on", fallback=True))
    return Stats


def _count(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def emit_interval_metrics(summary: Mapping[str, Any], *, dag_id: str, stream: str) -> dict[str, int | float]:
    """Send the interval counters and its lag (module docstring) from ``summary`` (``RunSummary.as_dict()``).

    Counts a stage did not report (an empty interval skips Spark: no decode summary) are left out.
    A rerun of an interval sends its counts again (counters add up what was processed).

    :param summary: the ``summary`` task's result; ``dag_id``/``stream``: the tags.
    :return: ``{metric name: value}`` of what was sent (per reason: ``name.<reason>``).
    """
    tags = {"dag_id": dag_id, "stream": stream}
    sent: dict[str, int | float] = {}
    backend = stats()
    for name, (app, key) in INTERVAL_COUNTERS.items():
        source = summary if app is None else (summary.get(app) or {})
        value = _count(source.get(key))
        if value is not None:
            backend.incr(name, value, tags=tags)
            sent[name] = value
    for reason, count in ((summary.get("decode") or {}).get("per_reason") or {}).items():
        value = _count(count)
        if value:
            safe = _UNSAFE.sub("_", str(reason))
            backend.incr(f"{QUARANTINED_BY_REASON}.{safe}", value, tags={**tags, "reason": safe})
            sent[f"{QUARANTINED_BY_REASON}.{safe}"] = value
    lag = summary.get("lag_seconds")
    if isinstance(lag, (int, float)):
        backend.gauge(INTERVAL_LAG, float(lag), tags=tags)
        sent[INTERVAL_LAG] = float(lag)
    log.info("Metrics of interval %s: %s", summary.get("interval_id"), sent)
    return sent


def chain_values(view: Any) -> dict[str, int | float]:
    """The :data:`CHAIN_GAUGES` values of a status view (``status.ChainStatus``); the lag's only when
    it has one (``with_stream_lag``)."""
    values: dict[str, int | float] = {
        f"{PREFIX}.chain.holes": len(view.holes), f"{PREFIX}.chain.stale": len(view.stale),
        f"{PREFIX}.chain.failed": len(view.failed), f"{PREFIX}.chain.unfinished": len(view.unfinished),
        f"{PREFIX}.chain.problems": len(view.problems()), f"{PREFIX}.chain.committed": view.committed}
    if view.lag is not None:
        values[f"{PREFIX}.chain.lag_messages"] = view.lag.messages
        values[f"{PREFIX}.chain.lag_seconds"] = view.lag.seconds
    return values


def emit_chain_metrics(view: Any, *, dag_id: str) -> dict[str, int | float]:
    """Send the chain gauges (:func:`chain_values`) of ``view``, tagged ``dag_id`` and its stream.

    :return: ``{metric name: value}`` of what was sent.
    """
    values = chain_values(view)
    backend = stats()
    for name, value in values.items():
        backend.gauge(name, value, tags={"dag_id": dag_id, "stream": view.stream})
    return values
