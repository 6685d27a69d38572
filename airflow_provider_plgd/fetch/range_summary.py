"""The typed result of one range fetch (the ETL fetch task's XCom): :class:`RangeSummary`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_provider_plgd.tables import ledger
from airflow_provider_plgd.tables.layout import Layout


@dataclass(frozen=True)
class RangeSummary:
    """What one range fetch (:meth:`FetchPipeline.run_range`) staged; :meth:`as_dict` is the
    task's XCom.

    :ivar stream: the stream. :ivar layout: the storage root. :ivar table: the staging table's URI.
    :ivar interval_id: the interval. :ivar range: the plan's range (sequences, count).
    :ivar count: messages staged. :ivar bytes: their payload bytes.
    :ivar first_seq: the first staged stream sequence, or None. :ivar last_seq: the last, or None.
    :ivar owners: owners with messages (without ``_unrouted``). :ivar batches: (owner, event type) batches.
    :ivar files: staging files committed. :ivar skipped: messages not staged, by reason.
    :ivar delta_version: the staging table's version of the range's commit.
    :ivar record: the path of the range's ledger record.
    """

    stream: str
    layout: Layout
    table: str
    interval_id: str
    range: ledger.PlanRange
    count: int
    bytes: int
    first_seq: int | None
    last_seq: int | None
    owners: int
    batches: int
    files: int
    skipped: dict[str, int]
    delta_version: int | None
    record: str

    def as_dict(self) -> dict[str, Any]:
        """``{"stream", "mode": "range", "root", "table", "interval_id", "range", "count", "bytes",
        "first_seq", "last_seq", "owners", "batches", "files", "skipped", "delta_version", "record"}``."""
        return {
            "stream": self.stream, "mode": "range", "root": self.layout.root, "table": self.table,
            "interval_id": self.interval_id, "range": self.range.as_dict(), "count": self.count, "bytes": self.bytes,
            "first_seq": self.first_seq, "last_seq": self.last_seq, "owners": self.owners, "batches": self.batches,
            "files": self.files, "skipped": dict(self.skipped), "delta_version": self.delta_version,
            "record": self.record,
        }
