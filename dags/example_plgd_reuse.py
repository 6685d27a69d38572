"""example_plgd_reuse: the plgd sensor and fetch operator in your own DAG, on Airflow 3's default settings.

Each run covers its data interval `[data_interval_start, data_interval_end)`:

1. `wait_for_interval` (`JetStreamIntervalCompleteSensor`, deferrable: needs a triggerer): the
   interval is complete in the stream;
2. `fetch` (`JetStreamToStagingOperator`): every message of `plgd.>` in the interval into the
   staging Delta table, one committed batch (no Spark);
3. `count_event_types` (your own task): reads the committed batch with
   `airflow_provider_plgd.tables.staging.read_staged` (or any Delta reader: `deltalake`, Polars'
   `read_delta`) and counts the messages per owner and event type
   (`plgd.subjects.parse_subject`). XCom:
   `{"interval_id", "count", "per_owner": {owner: {event_type: n}}, "other_subjects"}`.

**The schedule must be a data-interval timetable.** On Airflow 3, `schedule=timedelta(hours=1)`
or a cron string gives runs that cover one point in time (`DeltaTriggerTimetable`,
`CronTriggerTimetable`); the fetch then fails with a message naming this fix. This file uses
`DeltaDataIntervalTimetable(INTERVAL)`; `CronDataIntervalTimetable("0 * * * *", timezone="UTC")`
works the same way.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

# On Airflow 3 these are `from airflow.sdk import DAG, DeltaDataIntervalTimetable, Param, task`;
# the compat module also gives them on Airflow 2.11, where every file in dags/ must import too.
from airflow_provider_plgd.compat import DAG, DeltaDataIntervalTimetable, Param, task
from airflow_provider_plgd.operators.jetstream_to_staging import JetStreamToStagingOperator
from airflow_provider_plgd.sensors.interval_complete import JetStreamIntervalCompleteSensor
from airflow_provider_plgd.tables.layout import Layout

INTERVAL = timedelta(hours=1)


@task(task_display_name="Count messages per owner and event type")
def count_event_types(fetched: dict[str, Any]) -> dict[str, Any]:
    """Count the staged messages of the fetch task's XCom per owner and event type.

    :param fetched: the ``JetStreamToStagingOperator`` XCom (``root``, ``stream``, ``batches``:
        ``[{"owner_id", "event_type", "interval_id", ...}]``).
    """
    # lazy: in the task, so that parsing this DAG file stays light (Airflow's best practice)
    from airflow_provider_plgd.plgd.subjects import parse_subject
    from airflow_provider_plgd.tables import staging

    per_owner: dict[str, dict[str, int]] = {}
    other = count = 0
    interval_id = None
    for batch in fetched.get("batches", []):
        interval_id = batch["interval_id"]
        for subject in staging.read_staged(Layout.of(fetched["root"]), fetched["stream"], interval_id, owners=[batch["owner_id"]],
                                           event_types=[batch["event_type"]], columns=["subject"]
                                           ).column("subject").to_pylist():
            count += 1
            try:
                parsed = parse_subject(subject)
            except ValueError:
                other += 1
                continue
            counts = per_owner.setdefault(parsed.owner_id, {})
            counts[parsed.event_type] = counts.get(parsed.event_type, 0) + 1
    return {"interval_id": interval_id, "count": count, "other_subjects": other,
            "per_owner": {o: dict(sorted(c.items())) for o, c in sorted(per_owner.items())}}


with DAG(
    dag_id="example_plgd_reuse",
    description="Your own DAG with the plgd sensor and fetch operator (data-interval timetable)",
    schedule=DeltaDataIntervalTimetable(INTERVAL),
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    max_active_runs=1,
    params={
        "stream": Param("EVENTS", type="string", minLength=1,
                        description="JetStream stream that holds the plgd events."),
        "settle_seconds": Param(60, type="integer", minimum=0,
                                description="Seconds after the interval end before it counts as complete."),
    },
    tags=["plgd", "example"],
    doc_md=__doc__,
) as dag:
    wait = JetStreamIntervalCompleteSensor(
        task_id="wait_for_interval",
        jetstream_conn_id="plgd_jetstream_default",
        stream="{{ params.stream }}",
        subject_filter="plgd.>",
        settle_seconds="{{ params.settle_seconds }}",
        deferrable=True,
        timeout=3600,
    )
    fetch = JetStreamToStagingOperator(
        task_id="fetch",
        jetstream_conn_id="plgd_jetstream_default",
        stream="{{ params.stream }}",
        subject_filter="plgd.>",
        settle_seconds="{{ params.settle_seconds }}",
    )
    wait >> fetch
    count_event_types(fetch.output)
