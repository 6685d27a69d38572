"""OpenLineage datasets of the ETL's tasks (``apache-airflow-providers-openlineage``, extra ``lineage``).

Pure functions that build the ``OperatorLineage`` (inputs, outputs) of each stage; the operators'
``get_openlineage_facets_on_complete`` methods and the ETL's Python tasks call them. Dataset
names (``docs/lineage.md``):

* a JetStream stream: namespace ``nats://{host}:{port}`` (the connection's first server in sorted
  order; port 4222 when the URL has none), name ``{stream}``; the subject filters a task read are
  the input facet ``natsSubjects`` (:class:`NatsSubjectsInputFacet`). The OpenLineage naming spec
  has no NATS entry; this follows its Kafka entry (``kafka://{bootstrap host}:{port}``, ``{topic}``).
* tables under the storage root, as the spec names files: a local path is namespace ``file`` and
  name the absolute path; ``s3://``, ``s3a://``, ``s3n://`` are namespace ``s3://{bucket}`` and
  name the object key; ``gs://`` / ``gcs://`` ``gs://{bucket}``; ``hdfs://`` ``hdfs://{host}:{port}``;
  another fsspec URL ``{scheme}://{authority}`` and the path. A table is its Delta table folder
  (``events``, ``snapshots/resources``; ``airflow_provider_plgd.tables.delta_tables``), as the OpenLineage
  Spark integration names Delta tables.

Without the OpenLineage provider (or with it disabled: no transport configured) nothing here is
called by the ETL's Python tasks (:func:`report_task_lineage` returns at once), and the
operators' methods are only called by the provider's listener.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from airflow_provider_plgd.plgd import tables as snapshot_tables
from airflow_provider_plgd.tables import delta_tables, ledger
from airflow_provider_plgd.tables.layout import Layout

try:  # the `lineage` extra
    import attr
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import InputDataset, OutputDataset
    from openlineage.client.facet_v2 import InputDatasetFacet

    @attr.define
    class NatsSubjectsInputFacet(InputDatasetFacet):
        """Input facet ``natsSubjects``: the subject filters a task read from a JetStream stream.

        ``subjectFilters``: the filters, sorted, at most :data:`MAX_SUBJECT_FILTERS`;
        ``subjectFilterCount``: how many filters there were (more than listed when cut).
        """

        subjectFilters: list[str] = attr.field(factory=list)  # OpenLineage JSON names
        subjectFilterCount: int = 0

        @staticmethod
        def _get_schema() -> str:
            return "https://github.com/plgd-dev/airflow-provider-plgd/blob/main/docs/lineage.md#natssubjects"
except ImportError:  # pragma: no cover - without the lineage extra
    OperatorLineage = None  # type: ignore[assignment,misc]
    NatsSubjectsInputFacet = None  # type: ignore[assignment,misc]


#: The scheme of a JetStream stream's dataset namespace (not in the OpenLineage naming spec).
NATS_SCHEME = "nats"
#: The NATS client port when a server URL has none.
DEFAULT_NATS_PORT = 4222
#: At most this many subject filters are listed in the ``natsSubjects`` facet (the count is complete).
MAX_SUBJECT_FILTERS = 100

#: The interval tables under the storage root (``delta_tables``; every path comes from ``layout.Layout``).
EVENTS, QUARANTINE, EVENTS_DEDUPED, MSGID_INDEX = (
    delta_tables.EVENTS, delta_tables.QUARANTINE, delta_tables.EVENTS_DEDUPED, delta_tables.MSGID_INDEX)
#: The public snapshot tables (``snapshots/{table}``), one dataset each.
SNAPSHOT_TABLES = tuple(snapshot_tables.SNAPSHOT_TABLES)

_FILE_SCHEMES = {"s3": "s3", "s3a": "s3", "s3n": "s3", "gs": "gs", "gcs": "gs"}


def is_enabled() -> bool:
    """True when the OpenLineage provider is installed and enabled (a transport is configured;
    ``[openlineage] disabled`` is not set): ``airflow.providers.openlineage.conf.is_disabled``."""
    if OperatorLineage is None:
        return False
    # lazy: the `lineage` extra's provider may not be installed
    from airflow.providers.openlineage import conf

    return not conf.is_disabled()


def nats_namespace(servers: Sequence[str]) -> str:
    """``nats://{host}:{port}`` of the first of ``servers`` (NATS URLs) in sorted order.

    The scheme is ``nats`` whatever the URL's (``tls``, ``ws``, ``wss``): the namespace names the
    server, not the transport. No user info (credentials) ever appears.

    :raises ValueError: no servers, or a URL without a host.
    """
    hosts = []
    for url in servers:
        parts = urlsplit(url if "://" in url else f"nats://{url}")
        if not parts.hostname:
            raise ValueError(f"NATS server URL {url!r} has no host; expected e.g. nats://127.0.0.1:4222")
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        hosts.append(f"{host}:{parts.port or DEFAULT_NATS_PORT}")
    if not hosts:
        raise ValueError("no NATS servers to name the stream's namespace by")
    return f"{NATS_SCHEME}://{sorted(hosts)[0]}"


def stream_dataset(servers: Sequence[str], stream: str, subject_filters: Sequence[str]) -> Any:
    """The input dataset of a JetStream ``stream`` read with ``subject_filters``.

    :return: ``InputDataset(namespace=nats_namespace(servers), name=stream,
        inputFacets={"natsSubjects": NatsSubjectsInputFacet(...)})``.
    """
    filters = sorted(set(subject_filters))
    facet = NatsSubjectsInputFacet(subjectFilters=filters[:MAX_SUBJECT_FILTERS], subjectFilterCount=len(filters))
    return InputDataset(namespace=nats_namespace(servers), name=stream, inputFacets={"natsSubjects": facet})


def storage_location(location: str, *parts: str) -> tuple[str, str]:
    """``(namespace, name)`` of the folder ``{location}/{parts...}`` (see the module docstring).

    :param location: a storage location: a local path, a ``file://`` URL or an fsspec URL.
    :raises ValueError: an empty location.
    """
    if not location or not str(location).strip():
        raise ValueError("empty storage root; expected a path or a URL such as s3://bucket/plgd")
    url = "/".join([str(location).rstrip("/"), *(p.strip("/") for p in parts)])
    split = urlsplit(url)
    if "://" not in url or split.scheme in ("", "file", "local"):
        path = split.path if "://" in url else url
        return "file", os.path.abspath(path)
    scheme = _FILE_SCHEMES.get(split.scheme, split.scheme)
    return f"{scheme}://{split.netloc}", split.path.lstrip("/")


def _input(location: str) -> Any:
    namespace, name = storage_location(location)
    return InputDataset(namespace=namespace, name=name)


def _output(location: str) -> Any:
    namespace, name = storage_location(location)
    return OutputDataset(namespace=namespace, name=name)


def plan_lineage(servers: Sequence[str], stream: str, layout: Layout, scope_filter: str) -> Any:
    """``plan``: counts ``scope_filter`` (``plgd.>``) of the stream, writes the interval ledger."""
    return OperatorLineage(inputs=[stream_dataset(servers, stream, [scope_filter])],
                           outputs=[_output(layout.ledger_stream_dir(stream))])


def fetch_lineage(servers: Sequence[str], stream: str, layout: Layout, subject_filters: Sequence[str]) -> Any:
    """``fetch``: the subjects it read from the stream -> the stream's staging table."""
    return OperatorLineage(inputs=[stream_dataset(servers, stream, subject_filters)],
                           outputs=[_output(layout.staging_table(stream))])


def summary_lineage(stream: str, layout: Layout) -> Any:
    """``summary``: reads the ledger and the applications' run summaries, writes the ledger's summary."""
    return OperatorLineage(inputs=[_input(layout.ledger_stream_dir(stream)), _input(layout.runs_dir())],
                           outputs=[_output(layout.ledger_stream_dir(stream))])


def _decode_lineage(layout: Layout, a: Mapping[str, str]) -> tuple[list[Any], list[Any]]:
    return ([_input(layout.staging_table(a["--stream"]))],
            [_output(layout.table(EVENTS)), _output(layout.table(QUARANTINE))])


def _dedupe_lineage(layout: Layout, a: Mapping[str, str]) -> tuple[list[Any], list[Any]]:
    return ([_input(layout.table(EVENTS)), _input(layout.table(MSGID_INDEX))],
            [_output(layout.table(EVENTS_DEDUPED)), _output(layout.table(MSGID_INDEX))])


def _rebuild_lineage(layout: Layout, a: Mapping[str, str]) -> tuple[list[Any], list[Any]]:
    snapshots = Layout.of(a["--snapshots-root"]) if a.get("--snapshots-root") else layout
    return ([_input(layout.table(EVENTS_DEDUPED))] + [_input(snapshots.snapshot_table(t)) for t in SNAPSHOT_TABLES],
            [_output(snapshots.snapshot_table(t)) for t in SNAPSHOT_TABLES])


#: The datasets of each Spark application (``spark_apps/*.py``) from its ``--root`` and other arguments.
_SPARK_APPS = {"decode_events": _decode_lineage, "dedupe_events": _dedupe_lineage,
               "rebuild_snapshots": _rebuild_lineage}


def spark_app_lineage(application: str, application_args: Sequence[Any]) -> Any:
    """The datasets of one of the three Spark applications, from its file name and arguments.

    ``decode_events``: staging -> ``events``, ``quarantine``; ``dedupe_events``: ``events`` and the
    message-ID index -> ``events_deduped`` and the index; ``rebuild_snapshots``:
    ``events_deduped`` and the previous snapshot -> the four ``snapshots/{table}`` tables.

    :param application: the application's path (``…/spark_apps/<name>.py``).
    :param application_args: its rendered arguments (``--flag value`` pairs; flags without a value allowed).
    :return: the ``OperatorLineage``, or None for another application (no datasets known) and for
        arguments that are still templates (a task skipped before it was rendered wrote nothing).
    :raises ValueError: a known application without an argument it needs (names the argument).
    """
    build = _SPARK_APPS.get(os.path.splitext(os.path.basename(str(application)))[0])
    if build is None:
        return None
    args = [str(a) for a in application_args]
    if any("{{" in a for a in args):
        return None
    values = {flag: value for flag, value in itertools.pairwise(args)
              if flag.startswith("--") and not value.startswith("--")}
    try:
        inputs, outputs = build(Layout.of(values["--root"]), values)
    except KeyError as err:
        raise ValueError(f"Spark application {application!r}: argument {err.args[0]} missing in {args!r}") from None
    return OperatorLineage(inputs=inputs, outputs=outputs)


def fetch_subject_filters(targets: Sequence[tuple[str, str, Sequence[str]]], *, owner_wide: bool) -> list[str]:
    """The subject filters the fetch operator reads for its ``targets`` (``(owner, event type,
    filters)`` triples): one ``plgd.owners.{owner}.>`` per owner when it reads owner-wide (``owner_ids``),
    else the targets' own filters (``unrouted``: ``plgd.>``)."""
    if owner_wide:
        return sorted({ledger.read_filter(owner) for owner, _event_type, _filters in targets})
    return sorted({f for _owner, _event_type, filters in targets for f in filters})


def spark_submit_kwargs() -> dict[str, Any]:
    """Keyword arguments for ``SparkSubmitOperator`` of the ETL: with OpenLineage enabled,
    ``openlineage_inject_parent_job_info=True`` (the Airflow task's run becomes the parent run of
    the Spark application's OpenLineage events: ``spark.openlineage.parentJobNamespace``,
    ``parentJobName``, ``parentRunId`` and the ``rootParent*`` settings); else ``{}`` (the
    provider's ``[openlineage] spark_inject_parent_job_info`` default applies)."""
    return {"openlineage_inject_parent_job_info": True} if is_enabled() else {}


def report_task_lineage(context: Mapping[str, Any], build: Any, *args: Any) -> None:
    """Give the running ``@task`` the lineage ``build(*args)`` for its OpenLineage COMPLETE event.

    ``@task`` operators have no ``get_openlineage_facets_on_complete`` of their own; this sets one
    on the running task object (``context["task"]``), which the provider's listener calls after
    ``execute``. Does nothing when OpenLineage is not installed or disabled.
    """
    if not is_enabled():
        return
    operator_lineage = build(*args)
    context["task"].get_openlineage_facets_on_complete = lambda task_instance: operator_lineage
