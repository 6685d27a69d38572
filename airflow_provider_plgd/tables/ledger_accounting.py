"""The fetch's accounting against the interval's plan, read from the ledger's records.

``range r holds n(r) = staged(r) + skipped(r, reason)`` for every range of the plan
(:func:`range_problems`), each range's fetch record is of the plan's run and adds up
(:func:`staged_counts`), and the staging table holds exactly the recorded rows per range and event
type (:func:`check_staged_files`). The records: :mod:`airflow_provider_plgd.tables.ledger`. Pure
Python (no Airflow, no Spark): the fetch, decode and the summary step use it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_plgd.exceptions import LedgerError
from airflow_provider_plgd.tables import staging
from airflow_provider_plgd.tables.ledger import LEDGER_VERSION, EarlierRecord, FetchRecord, PlanRange, PlanRecord


def account_problems(what: str, expected: int, staged: int, skipped: Mapping[str, int]) -> list[str]:
    """``[]`` when ``staged + sum(skipped) == expected``, else one line naming ``what`` with the numbers."""
    got = int(staged) + sum(int(n) for n in skipped.values())
    if got == int(expected):
        return []
    return [f"{what}: the stream holds {expected} messages, fetched {got} "
            f"(staged {staged}, skipped {dict(skipped) or 0})"]


def range_problems(range_: PlanRange, staged: int, skipped: Mapping[str, int]) -> list[str]:
    """:func:`account_problems` of one range of the plan against its ``count``."""
    what = f"range {range_.index} (sequences [{range_.first_seq}, {range_.end_seq_exclusive}))"
    return account_problems(what, range_.count, staged, skipped)


def current_plan(plan: PlanRecord | EarlierRecord) -> PlanRecord:
    """``plan``, a record of this ledger version.

    :raises LedgerError: a plan of an earlier ledger version (names the interval and the version).
    """
    if isinstance(plan, EarlierRecord):
        raise LedgerError(f"interval {plan.interval_id}: the plan has ledger version {plan.version}, expected "
                          f"{LEDGER_VERSION}; run the interval again from its plan task", interval_id=plan.interval_id)
    return plan


def staged_counts(plan: PlanRecord | EarlierRecord,
                  records: Sequence[FetchRecord | EarlierRecord]) -> dict[tuple[int, str], int]:
    """What the ledger says each fetch range staged, checked against the plan:
    ``{(range index, event type): rows}`` (event types with messages only).

    :raises LedgerError: a plan of another ledger version, a range of the plan without a fetch
        record or with one for other sequences or another run of the plan, a record that does not
        add up (staged + skipped != the range's count, or its event types do not sum to its
        staged count), or a record of a range the plan does not have (names the interval, ranges
        and numbers).
    """
    plan = current_plan(plan)
    interval_id = plan.interval_id
    ranges = {r.index: r for r in plan.ranges}
    by_range = {r.range.index: r for r in records if isinstance(r, FetchRecord)}
    problems = [f"a fetch record names range {i}, which the plan does not have" for i in sorted(set(by_range) - set(ranges))]
    problems += [f"a fetch record of ledger version {r.version} (expected {LEDGER_VERSION})"
                 for r in records if isinstance(r, EarlierRecord)]
    counts: dict[tuple[int, str], int] = {}
    for index, rng in sorted(ranges.items()):
        got = by_range.get(index)
        if got is None:
            problems.append(f"range {index} (sequences [{rng.first_seq}, {rng.end_seq_exclusive})): the stream "
                            f"holds {rng.count} messages, no fetch task recorded it")
            continue
        if (got.range.first_seq, got.range.end_seq_exclusive) != (rng.first_seq, rng.end_seq_exclusive):
            problems.append(f"range {index}: the fetch read sequences [{got.range.first_seq}, "
                            f"{got.range.end_seq_exclusive}), the plan has [{rng.first_seq}, {rng.end_seq_exclusive})")
            continue
        if got.run_version != plan.run_version:
            problems.append(f"range {index}: its fetch record is of the plan's run {got.run_version}, the plan "
                            f"is run {plan.run_version}")
            continue
        problems += range_problems(rng, got.staged, got.skipped)
        mine = {et: int(v["count"]) for et, v in got.event_types.items() if int(v["count"])}
        if sum(mine.values()) != got.staged:
            problems.append(f"range {index}: its event types hold {sum(mine.values())} messages, "
                            f"its record says {got.staged} staged")
        counts.update(((index, et), n) for et, n in mine.items())
    if problems:
        raise LedgerError(f"interval {interval_id}: the fetch does not account for every message: "
                          + "; ".join(problems[:20]), interval_id=interval_id, problems=problems)
    return counts


def check_staged_files(plan: PlanRecord, counts: Mapping[tuple[int, str], int], files: Sequence[Any]) -> None:
    """Check the staging table's files of an interval against the ledger (decode, before it reads).

    Every file must be a range file (``staging.file_range``) of the plan's run version and of a
    range of the plan, and its rows (``numRecords`` of the Delta log) per (range, event type) must
    equal :func:`staged_counts`; so decode reads every staged row and nothing else.

    :param files: ``staging.StagedFile`` of the interval (``path``, ``rows``, ``event_type``).
    :raises LedgerError: naming the interval, the files and the numbers (at most 20 problems).
    """
    interval_id, run_version = plan.interval_id, plan.run_version
    ranges = {r.index for r in plan.ranges}
    problems: list[str] = []
    found: dict[tuple[int, str], int] = {}
    for f in files:
        place = staging.file_range(f.path)
        if place is None or place[1] != run_version or place[0] not in ranges:
            problems.append(f"staging file {f.path} ({f.rows} rows) is not of a range of the plan's run {run_version}")
            continue
        key = (place[0], f.event_type)
        found[key] = found.get(key, 0) + int(f.rows)
    for key in sorted(set(found) | set(counts)):
        if found.get(key, 0) != counts.get(key, 0):
            problems.append(f"range {key[0]}, event type {key[1]}: the staging table holds {found.get(key, 0)} rows, "
                            f"the fetch record {counts.get(key, 0)}")
    if problems:
        raise LedgerError(f"interval {interval_id}: the staging table does not hold what the fetch recorded: "
                          + "; ".join(problems[:20]), interval_id=interval_id, problems=problems)
