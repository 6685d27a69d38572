"""The ETL DAG's params: their defaults, their JSON schemas (the trigger form) and what a run used.

Every param is untrusted input of a triggering user: ``wait_for_interval`` and ``plan`` check them
again (``run_params.check_run``) before anything is read; those of the pipeline's identity must
equal the DAG author's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_provider_plgd.compat import Param
from airflow_provider_plgd.plgd.event_types import EVENT_TYPES

try:  # Airflow 3.x (the task SDK's settings)
    from airflow.sdk.configuration import conf
except ImportError:  # pragma: no cover - Airflow 2.11
    from airflow.configuration import conf  # type: ignore[no-redef]

#: Params of the ETL DAG; every one can be overridden per run (``--conf``) or per backfill.
DEFAULT_PARAMS: dict[str, Any] = {
    "stream": "EVENTS",
    "owners": [],  # [] = every owner with messages in the interval (and the unrouted messages)
    "event_types": [],  # [] = every event type on NATS (plgd.event_types.EVENT_TYPES: live + old hubs' snapshots)
    "storage_root": "",  # "" = the connection's storage_root extra, else $AIRFLOW_HOME/plgd
    "settle_seconds": 60,
    "max_fetch_tasks": 16,
    "lookback_intervals": 24,
    "accept_fewer_messages": False,  # True: a rerun may replace committed data with fewer messages
    "max_content_bytes": 4 * 1024 * 1024,  # decode: larger decoded events -> quarantine content_too_large
    "spark_conf": {},  # Spark settings of this run, merged over the DAG's (SPARK_CONF_PARAM_DESCRIPTION)
}

#: JSON-schema ``pattern`` of one owner ID in the trigger form: the rule of
#: ``plgd.subjects.validate_owner_id`` (no leading ``_``; no ``.``, ``*``, ``>``, ``/``, ``\``,
#: ``=``, ``?``, ``[``, ``]``, whitespace or control characters). ``plan`` checks the same again.
OWNER_ID_PATTERN = r"^[^_.*>/\\=?\[\]\s\x00-\x1f\x7f][^.*>/\\=?\[\]\s\x00-\x1f\x7f]*$"
#: JSON-schema ``pattern`` of a stream name (``jetstream.connection.check_stream_name``).
STREAM_NAME_PATTERN = r"^[^.*>/\\\s\x00-\x1f\x7f]+$"

#: The description of the ``spark_conf`` param (shown in the trigger form).
SPARK_CONF_PARAM_DESCRIPTION = (
    "Resource settings (--conf) of this run for decode, dedupe and rebuild, merged over the DAG's own; "
    "null removes one. Only the settings the DAG author allows (default: spark.executor.memory, "
    "spark.executor.cores, spark.executor.instances, spark.sql.shuffle.partitions, spark.default.parallelism, "
    "spark.dynamicAllocation.min/initial/maxExecutors); any other fails the run before Spark starts. "
    'E.g. {"spark.executor.memory": "4g"}. See docs/operations.md, "Who may set what".'
)


def param_schemas() -> dict[str, dict[str, Any]]:
    """JSON-schema keywords and descriptions of each param of :data:`DEFAULT_PARAMS`, for ``Param``.

    The trigger form shows ``description``, validates ``type``/``minimum``, and offers the
    ``examples`` of an array param as a multi-select (Airflow docs, "Params", "Use Params to
    Provide a Trigger UI Form"). Event types come from :data:`plgd.event_types.EVENT_TYPES`.
    """
    event_types = list(EVENT_TYPES)
    return {
        "stream": {"type": "string", "minLength": 1, "pattern": STREAM_NAME_PATTERN, "title": "Stream",
                   "description": "JetStream stream that holds the plgd events (subjects plgd.>)."
                                  " Part of the pipeline's identity: fixed by the DAG author; a run with another"
                                  " value fails at once."},
        # optional params: null (a cleared field) is their default, so the Trigger form submits them empty
        "owners": {"type": ["null", "array"], "items": {"type": "string", "pattern": OWNER_ID_PATTERN},
                   "uniqueItems": True, "title": "Owners",
                   "description": "Owner IDs to process (the <owner> of plgd.owners.<owner>.>, one per line; no "
                                  "'.', '*', '>', '/', '\\', '=', '?', '[', ']' or spaces, not starting with '_'). "
                                  "Empty: every owner with messages in the interval, and messages outside any "
                                  "owner are staged as unrouted. Part of the pipeline's identity: the DAG "
                                  "author's, or a subset written to another storage root the author allows."},
        "event_types": {"type": ["null", "array"], "items": {"type": "string", "enum": event_types}, "uniqueItems": True,
                        "examples": event_types, "title": "Event types",
                        "description": "plgd event types to stage; the others are skipped and counted in the "
                                       "ledger. Empty: every event type. Part of the pipeline's identity: the "
                                       "DAG author's, or a subset written to another storage root the author "
                                       "allows."},
        "storage_root": {"type": ["null", "string"], "title": "Storage root",
                         "description": "Root of staging and tables: a local path or an fsspec URL such as "
                                        "s3://bucket/plgd, one the DAG author allows (the DAG's default, "
                                        "build_etl_dag(storage_roots=...) or a folder below one, or the "
                                        "connection's), never inside or above another pipeline's root or a "
                                        "table. Empty: the connection's storage_root extra, else "
                                        "$AIRFLOW_HOME/plgd."},
        "settle_seconds": {"type": "integer", "minimum": 0, "title": "Settle time (s)",
                           "description": "Seconds after the interval end before it counts as complete "
                                          "(late publishes)."},
        "max_fetch_tasks": {"type": "integer", "minimum": 1, "title": "Max fetch tasks",
                            "description": "At most this many mapped fetch tasks, each reading one "
                                           "stream-sequence range of the interval."},
        "lookback_intervals": {"type": "integer", "minimum": 0, "title": "Dedupe lookback (intervals)",
                               "description": "Dedupe drops message IDs seen in this many earlier processed "
                                              "intervals (intervals without messages are not counted). Part of "
                                              "the pipeline's identity: fixed by the DAG author."},
        "accept_fewer_messages": {"type": "boolean", "title": "Accept fewer messages",
                                  "description": "Let a rerun replace committed data although the stream now "
                                                 "holds fewer messages for the interval (purged or re-created "
                                                 "stream). Off: such a rerun fails."},
        "max_content_bytes": {"type": "integer", "minimum": 1, "title": "Max content size (bytes)",
                              "description": "Decoded events larger than this go to quarantine "
                                             "(reason content_too_large). Part of the pipeline's identity: "
                                             "fixed by the DAG author."},
        "spark_conf": {"type": ["null", "object"], "title": "Spark settings",
                       "description": SPARK_CONF_PARAM_DESCRIPTION},
    }


def etl_params(overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """:data:`DEFAULT_PARAMS` updated with ``overrides``, each a ``Param`` with its :func:`param_schemas`.

    A key without a schema (a caller's own param) is passed through as given.
    """
    schemas = param_schemas()
    merged = {**DEFAULT_PARAMS, **(overrides or {})}
    return {k: Param(v, **schemas[k]) if k in schemas and not isinstance(v, Param) else v
            for k, v in merged.items()}


#: The params a run's summary reports besides its selection (owners and event types are in the
#: ledger's ``chain.selection``, bounded): what a backfill or a manual run actually used.
SUMMARY_PARAMS = ("stream", "settle_seconds", "max_fetch_tasks", "lookback_intervals", "accept_fewer_messages",
                  "max_content_bytes", "spark_conf")


def run_params_used(params: Mapping[str, Any], storage_root: str) -> dict[str, Any]:
    """``{"storage_root": the resolved root, **the values of SUMMARY_PARAMS}`` of one run (its
    ``params``: the DAG's defaults updated with the run's conf), for the summary's log line and XCom."""
    return {"storage_root": storage_root, **{k: params.get(k) for k in SUMMARY_PARAMS}}



def params_of_run(context: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The params one run uses: the DAG author's ``defaults`` (the DAG's params as built) updated with
    the run's own conf (``dag_run.conf``; Airflow's ``[core] dag_run_conf_overrides_params``), the
    values ``wait_for_interval`` and ``plan`` check against the pipeline's identity.

    Not ``context["params"]``: a process that runs several runs of one DAG object (``dag.test()``,
    ``airflow dags test``) keeps the values of an earlier run's conf in the tasks' ``Param``
    objects, so a later run without that key would get the earlier run's value (a narrower
    ``owners``, say) instead of the author's. A context without a run (a caller's own) gives its
    ``params``.

    :param context: the task's Airflow context. :param defaults: ``{param: value}`` of the DAG.
    :return: ``{param: value}``.
    """
    dag_run = context.get("dag_run")
    if dag_run is None:
        return dict(context.get("params") or defaults)
    conf_value = getattr(dag_run, "conf", None) or {}
    if not conf.getboolean("core", "dag_run_conf_overrides_params", fallback=True):
        conf_value = {}
    return {**defaults, **conf_value}
