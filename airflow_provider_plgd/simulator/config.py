"""Configuration of a simulation run (:class:`SimulationConfig`).

All times are unix nanoseconds unless a name says otherwise. Nothing here reads the wall clock:
the same config always generates the same bytes (``generate``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

__all__ = ["DEFAULT_START_TIME_NS", "LEADRT_MODES", "SimulationConfig"]

#: Default start of interval 0: 2026-01-01T00:00:00Z (a fixed value keeps ``generate`` deterministic).
DEFAULT_START_TIME_NS = 1_767_225_600_000_000_000

#: ``leadrt`` values: ``off`` = lead-resource-type feature disabled (subjects S4);
#: ``first`` = enabled with ``filter: first`` (S5 with the first resource type, S6 when the event
#: has no types); ``uuid`` = ``filter: first`` + ``useUUID: true`` (docs/wire-format.md §1.3).
LEADRT_MODES = ("off", "first", "uuid")


@dataclass(frozen=True)
class SimulationConfig:
    """What to simulate. Keyword construction recommended; ``validate()`` checks every field.

    :param seed: seed of the one ``random.Random`` used for everything (no global random state).
    :param owners: number of owners. Owners are raw owner strings ``"owner-1"``, ``"owner-2"``, ...
        (hashed to ``uuid5(URL, owner)`` in subjects, docs/wire-format.md §1.2), except that with 2 or
        more owners the last one is a UUID string, which plgd keeps unchanged as the owner ID.
    :param devices_per_owner: devices per owner (device IDs are UUIDs drawn from the seed).
    :param resources_per_device: resources per device, in this order: ``/light/1`` (core.light),
        ``/oic/d`` (oic.wk.d), ``/switches/1`` (oic.r.switch.binary), then ``/light/2``,
        ``/light/3``, ... All contents are ``application/vnd.ocf+cbor`` (10000).
    :param intervals: number of intervals (0 .. intervals-1).
    :param steps_per_interval: random activity steps per interval (one device does one thing per
        step: a notification, a command with its confirmation, a reconnect, ...; about 2-3
        messages on average). Interval 0 additionally registers every device first.
    :param start_time_ns: start of interval 0, unix ns. Interval k is
        ``[start_time_ns + k * interval_ns, start_time_ns + (k + 1) * interval_ns)``; every
        ``event_metadata.timestamp`` of interval k lies in it. ``publish(wait_for_intervals=True)``
        needs it to be in the (near) future of the machine clock.
    :param interval_seconds: interval length in seconds (> 0).
    :param leadrt: ``"off"``, ``"first"`` or ``"uuid"`` (see ``LEADRT_MODES``).
    :param duplicates: share in [0, 1) of messages published a second time with the same bytes;
        about half right after the original, half at a random place of the next interval.
    :param corrupt: number of corrupt payloads (random bytes, truncated protobuf, bad snappy),
        published on valid subjects.
    :param old_hub_snapshots: devices 1, 5, 9, ... (device 0 when there is only one) behave
        like a hub older than v2.16.0: after every ``snapshot_threshold`` events of an aggregate
        they publish a ``*snapshottaken`` event with its own version (docs/wire-format.md §4.2).
    :param snapshot_threshold: events between two old-hub snapshots (the hub's default was 16; the
        default 3 makes short simulations contain snapshots of every aggregate kind).
    :param version_gaps: publish version gaps: a forced update on an unpublished resource whose
        pending event consumes a version but is not published (docs/wire-format.md §3.1*), and one
        lost publish of a version-0 ``resourcechanged`` (first known version 1, §4.8).
    :param unregister: unregister devices (``devicesunregistered``) and re-create them later
        (registered again; all their aggregates restart at version 0; docs/wire-format.md §4.7).
    :param target_messages: if set, ``steps_per_interval`` is replaced by a value calibrated to
        produce about this many messages in total (for benchmarks).
    """

    seed: int = 1
    owners: int = 2
    devices_per_owner: int = 3
    resources_per_device: int = 3
    intervals: int = 3
    steps_per_interval: int = 20
    start_time_ns: int = DEFAULT_START_TIME_NS
    interval_seconds: float = 20.0
    leadrt: str = "off"
    duplicates: float = 0.0
    corrupt: int = 0
    old_hub_snapshots: bool = False
    snapshot_threshold: int = 3
    version_gaps: bool = False
    unregister: bool = False
    target_messages: int | None = None

    @property
    def interval_ns(self) -> int:
        """Interval length in ns (``round(interval_seconds * 1e9)``)."""
        return round(self.interval_seconds * 1_000_000_000)

    def interval_bounds(self) -> list[tuple[int, int]]:
        """``[(start_ns, end_ns), ...]`` of every interval, end exclusive."""
        step = self.interval_ns
        return [
            (self.start_time_ns + k * step, self.start_time_ns + (k + 1) * step)
            for k in range(self.intervals)
        ]

    def as_dict(self) -> dict:
        """The fields as a JSON-ready dict."""
        return asdict(self)

    def validate(self) -> SimulationConfig:
        """Return self if every field is valid; else raise ValueError/TypeError naming the field,
        the value and what was expected."""

        def _int(name: str, minimum: int) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"SimulationConfig.{name} must be an int, got {value!r}")
            if value < minimum:
                raise ValueError(f"SimulationConfig.{name} must be >= {minimum}, got {value!r}")

        for name in ("owners", "devices_per_owner", "resources_per_device", "intervals"):
            _int(name, 1)
        _int("steps_per_interval", 0)
        _int("corrupt", 0)
        _int("snapshot_threshold", 1)
        _int("seed", -(2**63))
        _int("start_time_ns", 0)
        if not isinstance(self.interval_seconds, (int, float)) or isinstance(self.interval_seconds, bool):
            raise TypeError(f"SimulationConfig.interval_seconds must be a number, got {self.interval_seconds!r}")
        if not math.isfinite(self.interval_seconds) or self.interval_ns < 1_000_000:
            raise ValueError(
                f"SimulationConfig.interval_seconds must be a finite number >= 0.001, got {self.interval_seconds!r}"
            )
        if self.leadrt not in LEADRT_MODES:
            raise ValueError(f"SimulationConfig.leadrt must be one of {LEADRT_MODES}, got {self.leadrt!r}")
        if not isinstance(self.duplicates, (int, float)) or isinstance(self.duplicates, bool):
            raise TypeError(f"SimulationConfig.duplicates must be a number, got {self.duplicates!r}")
        if not 0.0 <= self.duplicates < 1.0:
            raise ValueError(f"SimulationConfig.duplicates must be in [0, 1), got {self.duplicates!r}")
        for name in ("old_hub_snapshots", "version_gaps", "unregister"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"SimulationConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if self.target_messages is not None:
            _int("target_messages", 1)
        return self
