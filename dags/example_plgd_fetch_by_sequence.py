"""Two example DAGs that reuse ``JetStreamToStagingOperator`` without a data interval.

``example_plgd_fetch_by_sequence`` (manual runs): fetches the stream-sequence range
``[start_seq, end_seq]`` of ``subject_filter`` into staging, then summarises what it committed.
Useful to re-fetch a known range, e.g. the ``first_seq``/``last_seq`` of a
``JetStreamMessageTrigger`` event. Trigger it with a conf::

    airflow dags trigger example_plgd_fetch_by_sequence -c '{"start_seq": 1, "end_seq": 5000}'

``example_plgd_fetch_durable`` (every 15 minutes): a durable pull consumer (``durable`` param)
fetches up to ``max_messages`` messages it has not acknowledged yet, commits them as one staging
batch of ``interval_id`` ``durable-{first_seq}-{last_seq}`` and acknowledges them only after the
commit (at-least-once; see the operator's docstring). A run with nothing new commits nothing.

Params (both DAGs): ``stream`` (default ``EVENTS``), ``subject_filter`` (a JetStream filter subject,
default ``plgd.>``), ``storage_root`` (``""``: the connection's ``storage_root`` extra, else
``$AIRFLOW_HOME/plgd``); sequence DAG: ``start_seq`` (>= 1), ``end_seq`` (``null``: the stream's
last sequence when the task starts); durable DAG: ``durable`` (consumer name), ``max_messages``.

Both end with ``staging_summary``, which reads the ``subject`` column of the committed batch from
the staging Delta table (``airflow_provider_plgd.tables.staging.read_staged``: the files its log names,
pyarrow + fsspec, no Spark) and returns (XCom, JSON)::

    {"mode": "seq" | "durable", "interval_ids": ["seq-000000000001-000000000120"],
     "count": 120, "bytes": 34567, "first_seq": 1, "last_seq": 120,
     "per_owner": {"<owner_id>": {"<event_type>": 12, ...}, ...}, "other_subjects": 0}

``per_owner`` counts the staged messages by the owner and event type of their subject
(``plgd.subjects.parse_subject``); ``other_subjects`` counts subjects that are not plgd event
subjects. Each fetch task's output is an Airflow Asset (``plgd://<dag_id>/staging``).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from airflow_provider_plgd.compat import DAG, Asset, Param, task
from airflow_provider_plgd.operators.jetstream_to_staging import JetStreamToStagingOperator
from airflow_provider_plgd.run_params import env_storage_roots
from airflow_provider_plgd.tables.layout import Layout

JETSTREAM_CONN_ID = "plgd_jetstream_default"
#: The roots a run's storage_root param may name: set by the deployment (PLGD_ETL_STORAGE_ROOTS).
STORAGE_ROOTS = env_storage_roots()
START_DATE = datetime(2026, 1, 1, tzinfo=timezone.utc)


def common_params() -> dict[str, Any]:
    """The params both DAGs share, with the descriptions the trigger form shows."""
    return {
        "stream": Param("EVENTS", type="string", minLength=1,
                        description="JetStream stream that holds the plgd events."),
        "subject_filter": Param("plgd.>", type="string", minLength=1,
                                description="JetStream filter subject, e.g. plgd.> (every plgd event) or "
                                            "plgd.owners.<owner>.> (one owner)."),
        "storage_root": Param("", type="string",
                              description="Root of the staging table: empty for the connection's storage_root "
                                          "extra (else $AIRFLOW_HOME/plgd), or a root the deployment allows "
                                          "(PLGD_ETL_STORAGE_ROOTS, each with the folders below it)."),
    }


@task
def staging_summary(fetched: dict[str, Any]) -> dict[str, Any]:
    """Summarise the batches of a fetch task's XCom (see the module docstring for the shape).

    :param fetched: the fetch task's XCom (``JetStreamToStagingOperator`` return value).
    """
    # lazy: in the task, so that parsing this DAG file stays light (Airflow's best practice)
    import logging

    from airflow_provider_plgd.plgd.subjects import parse_subject
    from airflow_provider_plgd.tables import staging

    log = logging.getLogger("airflow.task")
    per_owner: dict[str, dict[str, int]] = {}
    other = 0
    interval_ids = []
    for batch in fetched.get("batches", []):
        if not batch.get("interval_id"):  # durable mode with nothing pending
            continue
        interval_ids.append(batch["interval_id"])
        subjects = staging.read_staged(Layout.of(fetched["root"]), fetched["stream"], batch["interval_id"],
                                       owners=[batch["owner_id"]], event_types=[batch["event_type"]],
                                       columns=["subject"]).column("subject").to_pylist()
        for subject in subjects:
            try:
                parsed = parse_subject(subject)
            except ValueError:
                other += 1
                continue
            counts = per_owner.setdefault(parsed.owner_id, {})
            counts[parsed.event_type] = counts.get(parsed.event_type, 0) + 1
    result = {
        "mode": fetched.get("mode"),
        "interval_ids": interval_ids,
        "count": int(fetched.get("count", 0)),
        "bytes": int(fetched.get("bytes", 0)),
        "first_seq": fetched.get("first_seq"),
        "last_seq": fetched.get("last_seq"),
        "per_owner": {o: dict(sorted(c.items())) for o, c in sorted(per_owner.items())},
        "other_subjects": other,
    }
    log.info("Staged %s messages (%s bytes), seq %s..%s, in %s", result["count"], result["bytes"],
             result["first_seq"], result["last_seq"], interval_ids or "no batch (nothing new)")
    for owner_id, counts in result["per_owner"].items():
        log.info("owner %s: %s", owner_id, counts)
    return result


with DAG(
    dag_id="example_plgd_fetch_by_sequence",
    schedule=None,
    start_date=START_DATE,
    catchup=False,
    params={
        **common_params(),
        "start_seq": Param(1, type="integer", minimum=1, description="First stream sequence to fetch."),
        "end_seq": Param(None, type=["null", "integer"], minimum=1,
                         description="Last stream sequence to fetch (inclusive). Empty: up to the stream's "
                                     "last sequence when the fetch starts."),
    },
    description="Fetch a stream-sequence range into staging and summarise it (manual runs)",
    tags=["plgd", "example"],
    doc_md=__doc__,
) as fetch_by_sequence:
    fetch = JetStreamToStagingOperator(
        task_id="fetch",
        jetstream_conn_id=JETSTREAM_CONN_ID,
        storage_roots=STORAGE_ROOTS,  # the roots a run may choose (run params are untrusted input)
        stream="{{ params.stream }}",
        subject_filter="{{ params.subject_filter }}",
        start_seq="{{ params.start_seq }}",
        end_seq="{{ params.end_seq if params.end_seq is not none else '' }}",
        outlets=[Asset(name="plgd_example_seq_staging", uri="plgd://example_plgd_fetch_by_sequence/staging")],
    )
    staging_summary(fetch.output)


with DAG(
    dag_id="example_plgd_fetch_durable",
    schedule=timedelta(minutes=15),
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    params={
        **common_params(),
        "durable": Param("plgd_example_durable", type="string", minLength=1,
                         description="Name of the durable pull consumer (created on first use)."),
        "max_messages": Param(100_000, type="integer", minimum=1,
                              description="At most this many unacknowledged messages per run."),
    },
    description="Stage what a durable consumer has not acknowledged yet, every 15 minutes",
    tags=["plgd", "example"],
    doc_md=__doc__,
) as fetch_durable:
    fetch = JetStreamToStagingOperator(
        task_id="fetch",
        jetstream_conn_id=JETSTREAM_CONN_ID,
        storage_roots=STORAGE_ROOTS,  # the roots a run may choose (run params are untrusted input)
        stream="{{ params.stream }}",
        subject_filter="{{ params.subject_filter }}",
        durable="{{ params.durable }}",
        max_messages="{{ params.max_messages }}",
        outlets=[Asset(name="plgd_example_durable_staging", uri="plgd://example_plgd_fetch_durable/staging")],
    )
    staging_summary(fetch.output)
