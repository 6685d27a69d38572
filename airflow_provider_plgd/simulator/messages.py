"""The simulated messages in publish order: :class:`SimMessage` and the compact :class:`MessageLog`.

A million messages as Python objects would take about a gigabyte; the log stores columns
(payloads in one list, numbers in ``array``\\ s, repeated strings interned once) and builds a
:class:`SimMessage` when one is read. It behaves like a read-only list.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from ..plgd.msgid import message_id

__all__ = ["FAULTS", "MessageLog", "SimMessage"]

#: Fault labels: index 0 = a regular message.
FAULTS: tuple[str | None, ...] = (None, "duplicate", "corrupt", "old_hub_snapshot")
FAULT_CODE = {name: i for i, name in enumerate(FAULTS)}


@dataclass(frozen=True, slots=True)
class SimMessage:
    """One message to publish.

    :ivar subject: NATS subject (docs/wire-format.md §1.1).
    :ivar data: payload bytes exactly as plgd publishes them (§2).
    :ivar interval: index of the interval it is published in.
    :ivar event_type: §3.1 event type (for corrupt payloads: the subject's event type).
    :ivar owner_id: subject owner token.
    :ivar device_id: device ID; None for identity-store events.
    :ivar href: resource href for resource events, else None.
    :ivar aggregate_id: envelope aggregate ID; None for identity-store events and corrupt payloads.
    :ivar version: aggregate version; None for identity-store events and corrupt payloads.
    :ivar timestamp_ns: inner event timestamp (``event_metadata.timestamp`` or the identity-store
        ``timestamp``), unix ns; for corrupt payloads the nominal time they were generated at.
    :ivar msg_id: ``plgd.msgid.message_id`` of the message (None for corrupt payloads).
    :ivar fault: ``"duplicate"``, ``"corrupt"``, ``"old_hub_snapshot"`` or None.
    """

    subject: str
    data: bytes
    interval: int
    event_type: str
    owner_id: str
    device_id: str | None
    href: str | None
    aggregate_id: str | None
    version: int | None
    timestamp_ns: int
    msg_id: str | None
    fault: str | None


class MessageLog(Sequence[SimMessage]):
    """Read-only, list-like sequence of :class:`SimMessage` in publish order, stored by column."""

    def __init__(self) -> None:
        self.subjects: list[str] = []
        self.data: list[bytes] = []
        self.intervals = array("i")
        self.key_index = array("i")
        self.versions = array("q")  # -1 = None
        self.timestamps = array("q")
        self.fault_codes = array("b")
        #: interned (event_type, owner_id, device_id, href, aggregate_id) tuples
        self.keys: list[tuple[str, str, str | None, str | None, str | None]] = []
        self._key_ids: dict[tuple, int] = {}
        self.total_bytes = 0

    def key_id(self, key: tuple[str, str, str | None, str | None, str | None]) -> int:
        """Index of an interned (event_type, owner_id, device_id, href, aggregate_id) tuple."""
        i = self._key_ids.get(key)
        if i is None:
            i = self._key_ids[key] = len(self.keys)
            self.keys.append(key)
        return i

    def append(self, subject: str, data: bytes, interval: int, key_id: int, version: int, timestamp: int,
               fault_code: int) -> int:
        """Append one message (``version`` -1 = none); return its index."""
        self.subjects.append(subject)
        self.data.append(data)
        self.intervals.append(interval)
        self.key_index.append(key_id)
        self.versions.append(version)
        self.timestamps.append(timestamp)
        self.fault_codes.append(fault_code)
        self.total_bytes += len(data)
        return len(self.data) - 1

    def copy_as(self, i: int, interval: int, fault_code: int) -> int:
        """Append message ``i`` again (same subject and bytes) in ``interval`` with ``fault_code``."""
        return self.append(self.subjects[i], self.data[i], interval, self.key_index[i], self.versions[i],
                           self.timestamps[i], fault_code)

    def __len__(self) -> int:
        return len(self.data)

    def msg_id(self, i: int) -> str | None:
        """``plgd.msgid.message_id`` of message ``i`` (None for corrupt payloads)."""
        if self.fault_codes[i] == FAULT_CODE["corrupt"]:
            return None
        event_type, _, _, _, aggregate_id = self.keys[self.key_index[i]]
        version = self.versions[i]
        return message_id(
            header_msg_id=None,
            subject=self.subjects[i],
            data=self.data[i],
            aggregate_id=aggregate_id,
            version=None if version < 0 else version,
            event_type=event_type,
            timestamp=self.timestamps[i],
        )

    def _get(self, i: int) -> SimMessage:
        event_type, owner_id, device_id, href, aggregate_id = self.keys[self.key_index[i]]
        version = self.versions[i]
        return SimMessage(
            subject=self.subjects[i],
            data=self.data[i],
            interval=self.intervals[i],
            event_type=event_type,
            owner_id=owner_id,
            device_id=device_id,
            href=href,
            aggregate_id=aggregate_id,
            version=None if version < 0 else version,
            timestamp_ns=self.timestamps[i],
            msg_id=self.msg_id(i),
            fault=FAULTS[self.fault_codes[i]],
        )

    @overload
    def __getitem__(self, i: int) -> SimMessage: ...

    @overload
    def __getitem__(self, i: slice) -> list[SimMessage]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._get(j) for j in range(*i.indices(len(self)))]
        n = len(self.data)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"message index {i} out of range (0..{n - 1})")
        return self._get(i)

    def __iter__(self) -> Iterator[SimMessage]:
        for i in range(len(self.data)):
            yield self._get(i)

    def interval_ranges(self, intervals: int) -> list[range]:
        """Index range of each interval's messages (messages are in interval order)."""
        bounds = [0] * (intervals + 1)
        for k in self.intervals:
            bounds[k + 1] += 1
        for k in range(intervals):
            bounds[k + 1] += bounds[k]
        return [range(bounds[k], bounds[k + 1]) for k in range(intervals)]
