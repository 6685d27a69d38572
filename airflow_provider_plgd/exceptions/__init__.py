"""Every exception class of the provider, in one place.

* JetStream access (the hook and the Spark data source): all derive from :class:`JetStreamError`
  so callers can catch one type (defined in :mod:`.jetstream`; :class:`PlgdError` in :mod:`.base`).
  Messages name the servers, stream or consumer involved and never contain credentials. Source
  of the JetStream error codes: NATS server ``server/errors.json`` (``err_code`` 10059 stream not
  found, 10039/10076 JetStream not enabled), as returned in the ``error`` object of
  ``$JS.API.*`` responses. :class:`TlsDowngradeError` guards the TLS handshake.
* The interval ledger and the tables: :class:`LedgerError` and its subclasses (among them the
  chain's :class:`ChainHoleError` and :class:`OutOfOrderIntervalError`), :class:`TableCommitError`,
  :class:`OldLayoutError`; the pipeline's identity: :class:`PipelineIdentityError`; roots that
  overlap: :class:`StorageRootOverlapError`.
* Decoding plgd messages: :class:`PlgdDecodeError` (reasons :data:`DECODE_ERROR_REASONS`).
* Spark's code: :class:`PyFilesIntegrityError`; Spark settings: :class:`SparkConfError`; the
  simulator: :class:`PublishError`.
* Bad input of a run (Airflow ``AirflowFailException`` subclasses, so the task fails without
  retries): :class:`UntrustedRunParamError`, :class:`MissingDataIntervalError`,
  :class:`OffScheduleIntervalError`, :class:`UntrustedPyFilesError`; and
  :class:`SparkApplicationTimeoutError` (an ``AirflowTaskTimeout``). These five live in
  :mod:`airflow_provider_plgd.exceptions.airflow_tasks` (their Airflow base classes come from
  :mod:`airflow_provider_plgd.compat`) and are imported from there on first use, so importing this
  module imports no Airflow: the Spark applications and their executors (which have no Airflow)
  import it for the errors above.
* Every class derives from :class:`PlgdError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_plgd.exceptions.base import PlgdError
from airflow_provider_plgd.exceptions.jetstream import (
    IntervalNotCompleteError,
    JetStreamAPIError,
    JetStreamAuthError,
    JetStreamConnectionError,
    JetStreamError,
    JetStreamNotEnabledError,
    JetStreamTimeoutError,
    MessagesExpiredError,
    RangeChangedError,
    StreamNotFoundError,
    StreamSourceStaleError,
    TlsDowngradeError,
)


class LedgerError(PlgdError):
    """The interval ledger does not add up: a stage cannot account for every message the stream
    holds for an interval (``docs/reliability.md``, "The interval ledger"). The message names the
    interval, the owner and the numbers. Nothing of the failing stage is committed.

    :ivar interval_id: the interval ID.
    :ivar problems: one line per problem (owner, stage and numbers).
    """

    def __init__(self, message: str, *, interval_id: str | None = None, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.interval_id = interval_id
        self.problems = list(problems or [])


class FewerMessagesError(LedgerError):
    """A rerun would replace an interval's committed data with fewer messages (the stream was
    re-created, purged, or messages were deleted from the middle of it). Refused unless the user
    asks for it explicitly (``accept_fewer_messages``)."""


class NarrowerRerunError(LedgerError):
    """A rerun of an interval selects fewer owners or event types than the interval's earlier run
    (the ``owners`` / ``event_types`` params): it would replace the interval's rows in every table
    and so delete the others'. Raised by ``plan`` before the ledger is rewritten; nothing is
    changed. The message names what the earlier run covered that this one does not.
    """


class IntervalGapError(LedgerError):
    """An earlier stretch of the stream was never planned (no run, e.g. a backfill of a later
    interval moved the schedule past it): the ledger has intervals before this one, but none that
    ends where this one starts (``ledger_guards.check_no_gap_before``), or a hole between two planned
    intervals further back (``ledger_guards.check_no_hole_before``: runs planned out of order).
    Processing this interval now would build its snapshot without the missing events. Raised by
    ``plan`` before anything is written; it is retried (a run of the missing interval may still be
    starting in a parallel backfill), then fails.

    :ivar gap_start_ns: start of the stretch without a planned interval (unix ns).
    :ivar gap_end_ns: its end (unix ns).
    """

    def __init__(self, message: str, *, interval_id: str, gap_start_ns: int, gap_end_ns: int) -> None:
        super().__init__(message, interval_id=interval_id, problems=message.splitlines()[:2])
        self.gap_start_ns = gap_start_ns
        self.gap_end_ns = gap_end_ns


class ChainHoleError(LedgerError):
    """A stage that builds on earlier intervals (dedupe, rebuild) found an earlier interval whose
    stream held messages but that no dedupe run committed (a failed or unfinished interval), after
    the last one that did: building now would lose its messages for good (``chain.check_no_hole``).
    Nothing is read or written; the task fails (retries apply: the missing interval may still be
    running). The message names the interval(s) and what to run.

    :ivar holes: the interval IDs, oldest first.
    """

    def __init__(self, message: str, *, interval_id: str, holes: list[str]) -> None:
        super().__init__(message, interval_id=interval_id, problems=[message.splitlines()[0]])
        self.holes = list(holes)


class OutOfOrderIntervalError(LedgerError):
    """An interval older than the chain's head (the latest interval the tables built on) that was
    never processed: dedupe and the snapshots of the later intervals are built without it, so
    processing it now would keep its duplicates and leave it out of every later snapshot.
    Raised by ``plan`` before anything is written, and by dedupe before it reads anything
    (``chain.check_not_behind_head``). Replay is not built: write the stream again to a new root.

    :ivar head: the chain's head interval ID.
    """

    def __init__(self, message: str, *, interval_id: str, head: str) -> None:
        super().__init__(message, interval_id=interval_id, problems=[message.splitlines()[0]])
        self.head = head


class PipelineIdentityError(PlgdError, ValueError):
    """A run's settings differ from the pipeline's identity (``airflow_provider_plgd.tables.identity``): the
    stream, the selection, the lookback, the decode limit or the storage root that the DAG author
    fixed and that the tables record. Raised before anything is read or written; in an Airflow task
    it fails the task without retries (the same settings would fail again).

    :ivar differences: ``[(setting, recorded or DAG author's value, this run's value)]``.
    """

    def __init__(self, message: str, *, differences: list[tuple[str, Any, Any]]) -> None:
        super().__init__(message)
        self.differences = list(differences)


class TableCommitError(PlgdError, OSError):
    """A Delta commit of one run was refused: a newer run of the same interval committed first, or a
    concurrent writer changed the rows the commit replaces (Delta's conflict check). Nothing of the
    run is visible. Source: Delta protocol, "Optimistic concurrency control".

    :ivar table: the table's URI.
    """

    def __init__(self, message: str, *, table: str) -> None:
        super().__init__(message)
        self.table = table


class MaintenanceError(PlgdError, RuntimeError):
    """Table maintenance found a compaction commit that changed the rows of an interval (it must
    never): the message names the table, the intervals, both counts and the version to restore.

    :ivar table: the table's URI.
    """

    def __init__(self, message: str, *, table: str) -> None:
        super().__init__(message)
        self.table = table


class OldLayoutError(PlgdError, ValueError):
    """The storage root holds tables in the layout before Delta Lake (``_manifest.json`` folders,
    ``snapshots/_latest.json``).

    :ivar path: the old folder or file found.
    """

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


class StorageRootOverlapError(PlgdError, ValueError):
    """A run's storage root overlaps another one: it lies inside, or holds, the root that the DAG
    writes by default, a recorded pipeline's root (``_ledger/pipeline.json``) or a Delta table
    (``_delta_log``) (``airflow_provider_plgd.tables.root_guard``). Raised before anything is written;
    in an Airflow task it fails the task without retries.

    :ivar run_root: the run's root. :ivar found: the root or table it overlaps.
    """

    def __init__(self, message: str, *, run_root: str, found: str) -> None:
        super().__init__(message)
        self.run_root = run_root
        self.found = found


class SparkConfError(PlgdError, TypeError, ValueError):
    """Spark settings to merge (``build_etl_dag(spark_conf=...)``, a run's ``spark_conf`` param
    reaching ``PlgdSparkSubmitOperator``) are not an object of setting name -> string, number,
    boolean or null (:func:`~airflow_provider_plgd.spark_conf.merge_spark_conf`). Both a
    ``TypeError`` and a ``ValueError``: the value has the wrong shape. The message names where the
    settings came from and the offending value."""


#: Allowed values of ``PlgdDecodeError.reason``.
DECODE_ERROR_REASONS = frozenset(
    {"bad_snappy", "bad_protobuf", "unknown_event_type", "bad_subject", "subject_mismatch",
     "content_too_large"}
)


class PlgdDecodeError(PlgdError, ValueError):
    """A plgd payload or subject could not be decoded.

    :ivar reason: ``"bad_snappy"`` (snappy block decompression failed), ``"bad_protobuf"``
        (protobuf parse failed, or parsed into something that is not a plgd message),
        ``"unknown_event_type"`` (the type is not in ``EVENT_TYPES`` for that format),
        ``"bad_subject"`` (not a plgd subject, or event type of the wrong family),
        ``"subject_mismatch"`` (subject and body disagree on event type, device or href), or
        ``"content_too_large"`` (the snappy block would decode to more than the cap).
    ``str(error)`` is the detail; it names the offending value, never the whole payload.
    Picklable (Spark ships exceptions between processes).
    """

    def __init__(self, reason: str, message: str) -> None:
        if reason not in DECODE_ERROR_REASONS:
            raise ValueError(
                f"PlgdDecodeError reason must be one of {sorted(DECODE_ERROR_REASONS)}, got {reason!r}"
            )
        super().__init__(message)
        self.reason = reason

    def __reduce__(self):
        return (type(self), (self.reason, str(self)))

    def __repr__(self) -> str:
        return f"PlgdDecodeError({self.reason!r}, {str(self)!r})"


class PyFilesIntegrityError(PlgdError, ValueError):
    """The ``--py-files`` zip cannot be trusted: its bytes differ from the SHA-256 in its name, the
    code installed on this worker builds a different zip than the one ``plan`` recorded, or the
    directory that holds it can be written by someone other than this worker's user.

    Raised by :func:`~airflow_provider_plgd.spark_deps.verified_py_files_zip` before anything runs
    the zip. The message names the path and both hashes (or the offending owner and mode).
    """


class ChainUnhealthyError(PlgdError, RuntimeError):
    """The chain of a pipeline has problems (``status.ChainStatus.problems``: a hole, a failed or stale
    interval, an overdue one) or lags the stream by more than its author allows. Raised by the
    monitor task (``etl.monitor``) so that Airflow's failure callbacks and notifiers fire; the
    message lists the problems (the first 20).

    :ivar problems: every problem, one line each.
    """

    def __init__(self, message: str, problems: list[str]) -> None:
        super().__init__(message)
        self.problems = problems

    def __reduce__(self):
        return (type(self), (str(self), self.problems))


class PublishError(PlgdError, RuntimeError):
    """The simulator's publishing failed, overflowed an interval window, or could not be verified."""


# The errors that subclass Airflow's exceptions live in ``exceptions.airflow_tasks``, which imports
# Airflow; they are imported from there on first use, so importing this module imports no Airflow.
_AIRFLOW_ERRORS = ("UntrustedRunParamError", "MissingDataIntervalError", "OffScheduleIntervalError",
                   "UntrustedPyFilesError", "SparkApplicationTimeoutError")

if TYPE_CHECKING:
    from airflow_provider_plgd.exceptions.airflow_tasks import (
        MissingDataIntervalError,
        OffScheduleIntervalError,
        SparkApplicationTimeoutError,
        UntrustedPyFilesError,
        UntrustedRunParamError,
    )


def __getattr__(name: str) -> Any:
    """The Airflow-bound errors, from :mod:`~airflow_provider_plgd.exceptions.airflow_tasks` (importing Airflow then)."""
    if name in _AIRFLOW_ERRORS:
        # lazy: these errors need Airflow, which the Spark executors lack
        from airflow_provider_plgd.exceptions import airflow_tasks

        return getattr(airflow_tasks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DECODE_ERROR_REASONS",
    "ChainHoleError",
    "ChainUnhealthyError",
    "FewerMessagesError",
    "IntervalNotCompleteError",
    "JetStreamAPIError",
    "JetStreamAuthError",
    "JetStreamConnectionError",
    "JetStreamError",
    "JetStreamNotEnabledError",
    "JetStreamTimeoutError",
    "LedgerError",
    "MaintenanceError",
    "MessagesExpiredError",
    "MissingDataIntervalError",
    "NarrowerRerunError",
    "OffScheduleIntervalError",
    "OldLayoutError",
    "OutOfOrderIntervalError",
    "PipelineIdentityError",
    "PlgdDecodeError",
    "PlgdError",
    "PublishError",
    "PyFilesIntegrityError",
    "RangeChangedError",
    "SparkApplicationTimeoutError",
    "SparkConfError",
    "StorageRootOverlapError",
    "StreamNotFoundError",
    "StreamSourceStaleError",
    "TableCommitError",
    "TlsDowngradeError",
    "UntrustedPyFilesError",
    "UntrustedRunParamError",
]
