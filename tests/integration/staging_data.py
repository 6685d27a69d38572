"""Simulated traffic staged the way the fetch operator stages it, for the Spark-side tests."""

from __future__ import annotations

from typing import Any

from airflow_provider_plgd import staging
from airflow_provider_plgd.plgd import subjects


def stage_simulation(root: Any, sim) -> list[tuple[str, str, int]]:
    """Write every interval's messages of ``sim`` (``simulator.generate``) under ``root`` (a path or
    fsspec URL) as committed staging batches, one per owner x event type, with the staging writer.

    Stream sequences are the publish order (1-based); server times lie inside the interval.

    :return: ``[(interval_id, end ISO, end ns)]``.
    """
    out = []
    for k, (start, end) in enumerate(sim.config.interval_bounds()):
        iid = staging.interval_id(start, end)
        groups: dict[tuple[str, str], list] = {}
        for seq, m in enumerate(sim.messages, start=1):
            if m.interval == k:
                subject = subjects.parse_subject(m.subject)
                groups.setdefault((subject.owner_id, subject.event_type), []).append(
                    (seq, m.subject, start + seq, None, m.data))
        for (owner, event_type), msgs in sorted(groups.items()):
            with staging.StagingWriter(root, stream="EVENTS", owner_id=owner, event_type=event_type,
                                       interval_id=iid, subject_filters=[f"plgd.owners.{owner}.>"],
                                       bounds={"kind": "time", "start_ns": start, "end_ns": end}) as w:
                w.write(msgs)
                w.commit()
        out.append((iid, staging.ns_to_iso(end), end))
    return out
