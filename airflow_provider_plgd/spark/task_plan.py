"""Packing units of work (staging row groups, Parquet files) into a few Spark tasks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

#: a unit: ``(name, index, rows, ...)``; the plan only reads ``rows`` (item 2) and sorts by items 0-1
_Unit = TypeVar("_Unit", bound=tuple[Any, ...])

def plan_tasks(units: Sequence[_Unit], slots: int, *, min_rows: int = 10_000,
               share: float = 0.25) -> list[list[_Unit]]:
    """Pack units of work (staging row groups, Parquet files) into Spark tasks: few tasks, sizes decreasing, even finish.

    Guided self-scheduling: Spark starts the tasks in list order on ``slots`` task slots, so
    task ``k`` gets about ``share * remaining_rows / slots`` rows (first-fit over the units,
    largest first; a unit is never split; the target is at least ``min_rows``). Early
    tasks are big (each task has a fixed overhead; docs/performance.md, M8), the last ones small,
    so both slots run out of work at about the same time. 974,286 rows in 75 row groups on
    2 slots -> 28 tasks instead of 75.

    :param units: ``(url, row_group, rows)`` tuples, e.g. ``decode_events.staging_units`` (any order;
        rows >= 0; ``row_group`` is any int, e.g. -1 for a whole file).
    :param slots: task slots (``spark.sparkContext.defaultParallelism``), >= 1.
    :param min_rows: smallest target task size in rows.
    :param share: fraction of the remaining work per slot given to the next task (0..1].
    :return: list of tasks (each a non-empty list of units); every unit exactly once.
    """
    left = sorted(units, key=lambda u: (-u[2], u[0], u[1]))
    remaining = sum(u[2] for u in left)
    slots = max(1, int(slots))
    tasks: list[list[_Unit]] = []
    while left:
        target = max(min_rows, int(share * remaining / slots))
        task: list[_Unit] = []
        rest: list[_Unit] = []
        rows = 0
        for unit in left:
            if not task or rows + unit[2] <= target:
                task.append(unit)
                rows += unit[2]
            else:
                rest.append(unit)
        tasks.append(task)
        left = rest
        remaining -= rows
    return tasks
