"""The typed plan of one interval (:class:`IntervalPlan`): what the ETL's ``plan`` task decided, and
its XCom form. No Airflow import: the operators and the DAG read it (``etl.plan`` builds it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_plgd.tables.layout import Layout
from airflow_provider_plgd.tables.ledger import ALL_OWNERS

__all__ = ["IntervalPlan"]


@dataclass(frozen=True)
class IntervalPlan:
    """What ``plan`` decided for one interval; the ``plan`` task's XCom is :meth:`to_xcom`, read back
    once by :meth:`from_xcom` (the fetch tasks get it with their range, the Spark tasks through the
    DAG's ``interval_plan(ti)`` macro).

    :param layout: the storage root, resolved and normalised once here.
    :param interval_id: the interval's ID; ``snapshot_time``: its end (ISO 8601).
    :param ledger: the interval's ledger folder (``layout.ledger_interval_dir``).
    :param owners: the number of selected owners, or None for every owner (``"all"`` in the XCom).
    :param messages: what the stream holds for the selection.
    :param fetch_ranges: the number of fetch ranges (one mapped fetch task each).
    :param py_files: the ``--py-files`` zip's path, or None on Spark Connect (each application
        ships its own code there: ``spark.session.ship_code``).
    :param spark_skip: why the Spark tasks skip the interval, or None (``etl.plan.spark_skip_reason``).
    """

    layout: Layout
    interval_id: str
    snapshot_time: str
    ledger: str
    owners: int | None
    messages: int
    fetch_ranges: int
    py_files: str | None
    spark_skip: str | None

    @property
    def owners_json(self) -> str | int:
        """``owners`` as JSON shows it: ``"all"`` (``ledger.ALL_OWNERS``) or the number selected."""
        return ALL_OWNERS if self.owners is None else self.owners

    def to_xcom(self) -> dict[str, Any]:
        """The XCom: ``{"storage_root", "interval_id", "snapshot_time", "ledger", "owners" ("all" or
        the number selected), "messages", "fetch_ranges" ([{"ledger_range": i}]: the mapped fetch
        tasks' kwargs), "py_files" (None on Spark Connect), "spark_skip"}``."""
        return {
            **self.layout.as_dict(),
            "interval_id": self.interval_id,
            "snapshot_time": self.snapshot_time,
            "ledger": self.ledger,
            "owners": self.owners_json,
            "messages": self.messages,
            "fetch_ranges": [{"ledger_range": i} for i in range(self.fetch_ranges)],
            "py_files": self.py_files,
            "spark_skip": self.spark_skip,
        }

    @classmethod
    def from_xcom(cls, value: IntervalPlan | Mapping[str, Any]) -> IntervalPlan:
        """From :meth:`to_xcom`'s XCom (the tasks after ``plan``); an ``IntervalPlan`` is returned as is.

        :raises ValueError: not a plan XCom (a key missing, a refused root).
        """
        if isinstance(value, IntervalPlan):
            return value
        try:
            owners = value["owners"]
            return cls(layout=Layout.from_dict(value), interval_id=str(value["interval_id"]),
                       snapshot_time=str(value["snapshot_time"]), ledger=str(value["ledger"]),
                       owners=None if owners == ALL_OWNERS else int(owners), messages=int(value["messages"]),
                       fetch_ranges=len(value["fetch_ranges"]),
                       py_files=None if value["py_files"] is None else str(value["py_files"]),
                       spark_skip=value.get("spark_skip"))
        except (KeyError, TypeError) as err:
            raise ValueError(f"not a plan XCom ({err!r} missing or malformed): {value!r}") from None

    #: The former names of :meth:`to_xcom` and :meth:`from_xcom`.
    as_dict = to_xcom
    from_dict = from_xcom
