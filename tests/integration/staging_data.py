"""Staging written the way the fetch operator writes it, for the Spark-side tests."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_plgd import times
from airflow_provider_plgd.fetch.stager import Stager
from airflow_provider_plgd.plgd import subjects
from airflow_provider_plgd.tables import staging, staging_commits
from airflow_provider_plgd.tables.layout import Layout


def write_batches(root: Any, interval_id: str, batches: Mapping[tuple[str, str], Sequence[tuple]], *,
                  stream: str = "EVENTS", commit: bool = True, **stager_kw: Any) -> list[dict]:
    """Write ``{(owner, event type): [(stream_seq, subject, time_ns, headers, data)]}`` into the
    staging table as the operator's batches (one ``staging_commits.commit_batches`` per owner; with
    ``commit=False`` the files are written and named by no commit). :return: the file records."""
    by_owner: dict[str, dict[str, Sequence[tuple]]] = {}
    for (owner, event_type), rows in batches.items():
        by_owner.setdefault(owner, {})[event_type] = rows
    records: list[dict] = []
    for owner, types in sorted(by_owner.items()):
        stager = Stager(stream=stream, spill_dir=None, **stager_kw)
        for event_type, rows in sorted(types.items()):
            stager.add(owner, event_type, list(rows))
        mine = stager.write(staging.table_uri(Layout.of(root), stream), interval_id,
                            staging.batch_file_prefix(owner, staging.new_write_id()))
        if commit:
            staging_commits.commit_batches(Layout.of(root), stream, interval_id, owner, sorted(types), mine, time.time_ns() // 1_000_000)
        records += mine
    return records


def stage_simulation(root: Any, sim) -> list[tuple[str, str, int]]:
    """Write every interval's messages of ``sim`` (``simulator.generate``) under ``root`` (a path or
    fsspec URL) as committed staging batches, one per owner x event type.

    Stream sequences are the publish order (1-based); server times lie inside the interval.

    :return: ``[(interval_id, end ISO, end ns)]``.
    """
    out = []
    for k, (start, end) in enumerate(sim.config.interval_bounds()):
        iid = times.interval_id(start, end)
        groups: dict[tuple[str, str], list] = {}
        for seq, m in enumerate(sim.messages, start=1):
            if m.interval == k:
                subject = subjects.parse_subject(m.subject)
                groups.setdefault((subject.owner_id, subject.event_type), []).append(
                    (seq, m.subject, start + seq, None, m.data))
        write_batches(root, iid, groups)
        out.append((iid, times.ns_to_rfc3339(end), end))
    return out
