"""# plgd_events_etl

Turns the plgd hub's event stream (NATS JetStream, subjects `plgd.>`) into analytics tables, one
**data interval** per run (the DAG's schedule: `PLGD_ETL_SCHEDULE_SECONDS`, 3600 s unless set). Each run processes `[data_interval_start, data_interval_end)`:

| Task | What it does |
|---|---|
| `wait_for_interval` | deferrable sensor: waits until the interval is complete in the stream (`settle_seconds` after its end). Refuses runs without a data interval and manual runs off the schedule (below) |
| `plan` | resolves the storage root, counts what the stream holds for the interval (the interval ledger, `_ledger/`) and cuts its stream-sequence range into ranges (`plgd.>`, or the `owners` param's subjects) |
| `fetch_ranges` | the ranges (at most `max_fetch_tasks`) the `fetch` task is mapped over |
| `fetch` (mapped) | one task per sequence range, one consumer: batches per owner and event type into the staging Delta table (one commit per range) |
| `spark_needed` | skips the three Spark tasks when the stream holds no message for the interval (nothing changes), e.g. every interval before the stream's first message |
| `decode` → `dedupe` → `rebuild` | Spark: typed events and quarantine, one row per message ID, the latest state per resource, device and owner (snapshot tables) |
| `summary` | checks that every message the stream holds is in the tables or in quarantine (fails the run otherwise), logs the counts, and expires the staging of reconciled intervals older than the retention (7 days) |

Runs are chained (`catchup`, one active run, `depends_on_past` on `dedupe` and `rebuild`): each
snapshot builds on the one before, and backfills run oldest first. The tasks also check the chain
from the data: after a failed interval, the later ones stop in `dedupe` and `summary` naming it
until it has run (docs/operations.md, "Holes in the interval chain"). Outputs are assets
`plgd_events_etl.{staging, events, quarantine, events_deduped, snapshots}`; their events carry the
interval ID and the counts.

**Manual runs.** A manual run must cover exactly one interval of the schedule. The Trigger
dialog's default logical date (now) gives an interval off the schedule, which is refused at once,
before anything is read or written. To (re)process an interval use the dialog's **Backfill**
option (or `airflow backfill create … --reprocess-behavior completed`), or clear that interval's
run. A run without a logical date fails at once too.

**Params** (Trigger form): each one has its description there. `owners` and `event_types` empty
mean "all". `stream`, `owners`, `event_types`, `lookback_intervals`, `max_content_bytes` and the
storage root are the pipeline's identity: a run may not change them (it fails at once, naming the
setting); the DAG's values come from `PLGD_ETL_PARAMS` and are recorded with the tables.

**Environment variables** of this DAG file, read when it is parsed (set them on every component
that parses DAGs, workers included; production usually keeps the defaults):

* `PLGD_ETL_SCHEDULE_SECONDS`: interval length in seconds (default 3600);
* `PLGD_ETL_START_DATE`: ISO date-time of the first interval (default 2026-01-01T00:00:00Z); intervals
  before the stream's first message cost no Spark work, but set it near the start of the stream's
  history to avoid many idle runs;
* `PLGD_ETL_END_DATE`: ISO date-time; no interval starting after it is scheduled (default none);
* `PLGD_ETL_CATCHUP`: `true` (default) or `false`: schedule every interval since the start date
  (or the last run), or only the newest one;
* `PLGD_ETL_PARAMS`: JSON object of param defaults (`etl.DEFAULT_PARAMS` keys);
* `PLGD_ETL_SPARK_CONF`: JSON object of Spark settings for the Spark tasks (`build_etl_dag(spark_conf=…)`);
* `PLGD_ETL_STORAGE_ROOTS`: JSON list of storage roots a run may choose with the `storage_root`
  param, each with the folders below it (`build_etl_dag(storage_roots=…)`; default none: a run may
  use the default root only). Run params are untrusted: docs/operations.md, "Who may set what";
* `PLGD_ETL_SPARK_CONNECT_CONN_ID`: a `spark_connect` connection ID: the Spark tasks run on that
  Spark Connect server instead of `spark-submit` (`build_etl_dag(spark_connect_conn_id=…)`, docs/spark-connect.md;
  default none). It takes no `PLGD_ETL_SPARK_CONF` or `PLGD_ETL_SPARK_HISTORY_URL` (`ValueError`);
* `PLGD_ETL_SPARK_HISTORY_URL`: the Spark History Server page of an application with `{app_id}`,
  e.g. `https://spark-history.example:18080/history/{app_id}/`: where the Spark tasks' "Spark
  application" link leads once the application ended (`build_etl_dag(spark_ui_url_template=…)`;
  default none: no link then).

More: docs/operations.md ("DAG parameters", "Manual runs", "Backfill and reruns").
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone

from airflow_provider_plgd.coerce import parse_bool
from airflow_provider_plgd.etl import build_etl_dag
from airflow_provider_plgd.run_params import env_storage_roots


def _env_datetime(name: str, default: str | None) -> datetime | None:
    value = os.environ.get(name, default)
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an ISO-8601 date-time") from None
    if parsed.tzinfo is None:
        raise ValueError(f"{name}={value!r} needs a time zone (e.g. +00:00 or Z)")
    return parsed.astimezone(timezone.utc)


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip()
    return parse_bool(value, name) if value else default


def _env_json_object(name: str) -> dict | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        parsed = json.loads(value)
    except ValueError:
        raise ValueError(f"{name} must be a JSON object, got {value!r}") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"{name} must be a JSON object, got {value!r}")
    return parsed


dag = build_etl_dag(
    dag_id="plgd_events_etl",
    schedule=timedelta(seconds=float(os.environ.get("PLGD_ETL_SCHEDULE_SECONDS", "3600"))),
    start_date=_env_datetime("PLGD_ETL_START_DATE", "2026-01-01T00:00:00+00:00"),
    end_date=_env_datetime("PLGD_ETL_END_DATE", None),
    catchup=_env_bool("PLGD_ETL_CATCHUP", True),
    params=_env_json_object("PLGD_ETL_PARAMS"),
    spark_conf=_env_json_object("PLGD_ETL_SPARK_CONF"),
    spark_connect_conn_id=os.environ.get("PLGD_ETL_SPARK_CONNECT_CONN_ID", "").strip() or None,
    storage_roots=env_storage_roots(),  # PLGD_ETL_STORAGE_ROOTS
    spark_ui_url_template=os.environ.get("PLGD_ETL_SPARK_HISTORY_URL", "").strip() or None,
    doc_md=__doc__,  # the user docs above: the DAG's docs panel shows them
)
