"""What a fetch must account for before it commits: staged + skipped equals what the stream holds
(:func:`check_accounted`), a committed range holds what the task read (:func:`check_committed_counts`),
and a rerun never replaces committed batches with fewer messages (:func:`refuse_fewer`).

Each check raises before anything is committed: :class:`~airflow_provider_plgd.exceptions.LedgerError`
or :class:`~airflow_provider_plgd.exceptions.FewerMessagesError`, naming the interval and the counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_provider_plgd.exceptions import FewerMessagesError, LedgerError
from airflow_provider_plgd.fetch.bounds import interval_and_read_kwargs
from airflow_provider_plgd.fetch.selection import Target
from airflow_provider_plgd.fetch.stager import Stager
from airflow_provider_plgd.tables import ledger, staging
from airflow_provider_plgd.tables.layout import Layout


def refuse_fewer(layout: Layout, stream: str, group: Sequence[Target], bounds: dict[str, Any], mode: str,
                 expected: int | None, *, accept_fewer: bool) -> None:
    """Raise FewerMessagesError when ``expected`` is below what the group's batches committed before
    (unless ``accept_fewer``): a rerun never replaces committed batches with fewer messages silently."""
    interval, _ = interval_and_read_kwargs(mode, bounds)
    owner = group[0].owner
    types = {t.event_type for t in group}
    committed = [f for f in staging.staged_files(layout, stream, interval_id=interval, event_types=types)
                 if staging.file_batch_owner(f.path) == owner]
    before = sum(f.rows for f in committed)
    if expected is None or expected >= before or accept_fewer:
        return
    per_type: dict[str, int] = {}
    for f in committed:
        per_type[f.event_type] = per_type.get(f.event_type, 0) + f.rows
    raise FewerMessagesError(
        f"interval {interval}: the stream {stream!r} now holds {expected} messages for "
        f"{'owner ' + owner if owner != staging.FILTER_OWNER else group[0].filters}, but {before} are committed in "
        f"staging ({', '.join(f'{k}: {v}' for k, v in sorted(per_type.items()))}); a rerun "
        "would replace them with fewer (the stream was re-created, purged, or messages were deleted). Nothing "
        "was changed. Set accept_fewer_messages=True to replace them anyway.",
        interval_id=interval, problems=[f"owner {owner}: stream {expected}, committed {before}"],
    )


def check_committed_counts(interval: str, index: int, stager: Stager, files: Sequence[staging.StagedFile]) -> None:
    """The committed range's files hold what this task counted, per event type (else LedgerError)."""
    committed: dict[str, int] = {}
    for f in files:
        committed[f.event_type] = committed.get(f.event_type, 0) + f.rows
    counted = {et: s.count for et, s in stager.summaries.items() if s.count}
    if committed != counted:
        raise LedgerError(f"interval {interval}: range {index} was committed with {dict(sorted(committed.items()))} "
                          f"rows per event type, this task read {dict(sorted(counted.items()))}; was the stream "
                          "changed? Run the interval again from its plan task", interval_id=interval)


def group_key(group: Sequence[Target], owner_wide: bool) -> str:
    """What a group of targets is accounted as: its owner (owner-wide reads) or its batch's event type."""
    return group[0].owner if owner_wide else group[0].event_type


def check_accounted(interval: str, what: str, expected: int | None, staged: int, skipped: dict[str, int]) -> None:
    """Raise LedgerError (nothing committed yet) unless staged + skipped == expected (None: not checked)."""
    if expected is None:
        return
    problems = ledger.account_problems(what, expected, staged, skipped)
    if problems:
        raise LedgerError(
            f"interval {interval}: {problems[0]}; nothing was committed for it. Messages arrived or were removed "
            "while the interval was read (is the interval complete? was the stream changed?); retry the task",
            interval_id=interval, problems=problems,
        )
