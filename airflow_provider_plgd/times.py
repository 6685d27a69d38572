"""Times and interval IDs: unix ns ⇄ ``datetime`` ⇄ RFC 3339, and the folder IDs of intervals.

Pure Python (no Airflow, no pyarrow): the Spark library imports it on executors.

* Unix ns (int) is the one internal time unit: JetStream stamps each message with a server time in
  ns (the ack reply subject carries it, NATS ADR-15), and the stream info answer gives RFC 3339
  times with 9 fraction digits (Go ``time.RFC3339Nano``).
* Interval IDs name the staging, ledger and output folders of one interval:
  ``{start}_{end}`` (compact UTC times, see :func:`compact_time`), ``seq-{first}-{last}`` and
  ``durable-{first}-{last}`` (12-digit stream sequences).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import total_ordering
from typing import Any

__all__ = [
    "Interval",
    "IntervalId",
    "compact_time",
    "durable_interval_id",
    "interval_end_epoch",
    "interval_id",
    "ns_to_rfc3339",
    "parse_interval_id",
    "parse_rfc3339_ns",
    "seq_interval_id",
    "to_ns",
]

NS_PER_S = 1_000_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def to_ns(value: datetime | int | str, what: str = "time", *, text: bool = True) -> int:
    """Convert a time to integer unix nanoseconds.

    :param value: a timezone-aware ``datetime`` (pendulum's too), an ``int`` of unix ns (>= 0), and
        with ``text`` also an ISO-8601 string with a timezone (``Z`` allowed) or a string of digits
        (unix ns, e.g. a rendered template).
    :param what: what the value is, for the error message.
    :param text: accept strings (the hook's API takes typed values only: ``text=False``).
    :return: unix time in ns.
    :raises ValueError: a naive datetime, a negative int, an unparseable string (names the value).
    :raises TypeError: another type (names the type and the value).
    """
    if text and isinstance(value, str):
        stripped = value.strip()
        if stripped.isdigit():
            return int(stripped)
        try:
            value = datetime.fromisoformat(stripped.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{what} {value!r} is not an ISO-8601 date-time") from None
    if isinstance(value, bool) or not isinstance(value, (int, datetime)):
        expected = "a timezone-aware datetime, ISO string or int unix ns" if text else \
            "a timezone-aware datetime or int unix ns"
        raise TypeError(f"{what} must be {expected}, got {type(value).__name__}: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{what} must be >= 0 unix ns, got {value}")
        return value
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware (UTC expected), got naive datetime {value.isoformat()}")
    # days/seconds/microseconds: also right for pendulum DateTimes (Airflow's data intervals), whose
    # difference is a pendulum Interval that does not support // timedelta
    delta = value.astimezone(timezone.utc) - _EPOCH
    return ((delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds) * 1000


def _format_ns(ns: int, pattern: str) -> str:
    """``strftime(pattern)`` of unix ns in UTC + ``.ffffff`` (whole microseconds) or
    ``.fffffffff`` (nanoseconds) when there is a fraction + ``Z``."""
    seconds, frac = divmod(int(ns), NS_PER_S)
    base = datetime.fromtimestamp(seconds, tz=timezone.utc).strftime(pattern)
    if frac == 0:
        return base + "Z"
    if frac % 1000 == 0:
        return f"{base}.{frac // 1000:06d}Z"
    return f"{base}.{frac:09d}Z"


def ns_to_rfc3339(ns: int) -> str:
    """Unix ns -> RFC 3339 UTC: ``2026-01-01T00:00:00.123456789Z`` (6 fraction digits for whole
    microseconds, none for whole seconds). Go's ``time.RFC3339Nano`` parses every form, so the
    JetStream API takes it (e.g. a consumer's ``opt_start_time``)."""
    return _format_ns(ns, "%Y-%m-%dT%H:%M:%S")


def parse_rfc3339_ns(value: Any) -> int | None:
    """Unix ns of a JetStream RFC 3339 timestamp (``2026-01-01T00:00:00.123456789Z``, any
    fraction length, ``Z`` or ``±hh:mm``); None for missing/empty values and Go's zero time
    (``0001-01-01T00:00:00Z``, what an empty stream reports).

    :raises ValueError: a non-empty value that is not RFC 3339 (names the value).
    """
    if value in (None, ""):
        return None
    text = str(value).strip()
    if text.startswith("0001-01-01T00:00:00"):
        return None
    main, frac, zone = text, "", ""
    for i, c in enumerate(text[19:], start=19):
        if c in "Zz+-":
            main, zone = text[:i], text[i:]
            break
    if "." in main:
        main, frac = main.split(".", 1)
    try:
        if not frac.isdigit() and frac != "":
            raise ValueError
        base = datetime.fromisoformat(main + (("+00:00" if zone in ("Z", "z") else zone) or "+00:00"))
    except ValueError:
        raise ValueError(f"stream timestamp {value!r} is not RFC 3339 (expected e.g. 2026-01-01T00:00:00.5Z)") from None
    return to_ns(base) + int((frac + "000000000")[:9] or 0)


def compact_time(ns: int) -> str:
    """Render unix nanoseconds (int) as the compact UTC time of folder names: ``YYYYMMDDTHHMMSSZ``,
    with ``.ffffff`` for whole microseconds or ``.fffffffff`` for nanoseconds
    (e.g. ``20260101T000000.500000Z``). The one home of this format: interval IDs (:func:`interval_id`) and
    snapshot versions (``airflow_provider_plgd.tables.snapshot_store.version_id``) use it;
    :func:`parse_interval_id` reads it back.
    """
    return _format_ns(ns, "%Y%m%dT%H%M%S")


def _parse_compact(text: str) -> int:
    if not text.endswith("Z"):
        raise ValueError(text)
    main, _, frac = text[:-1].partition(".")
    ns = to_ns(datetime.strptime(main, "%Y%m%dT%H%M%S").replace(tzinfo=timezone.utc))
    if frac:
        if len(frac) not in (6, 9) or not frac.isdigit():
            raise ValueError(text)
        ns += int(frac) * (1000 if len(frac) == 6 else 1)
    return ns


def _ordered_ns(start: datetime | int | str, end: datetime | int | str, names: tuple[str, str]) -> tuple[int, int]:
    start_ns, end_ns = to_ns(start, names[0]), to_ns(end, names[1])
    if end_ns <= start_ns:
        raise ValueError(f"interval end {ns_to_rfc3339(end_ns)} must be after its start {ns_to_rfc3339(start_ns)}")
    return start_ns, end_ns


def interval_id(start: datetime | int | str, end: datetime | int | str) -> str:
    """Return the folder ID of a time interval ``[start, end)``: ``{start}_{end}``.

    Each side is :func:`compact_time`. Example:
    ``interval_id(datetime(2026,1,1,tzinfo=UTC), datetime(2026,1,1,1,tzinfo=UTC))`` ==
    ``"20260101T000000Z_20260101T010000Z"``.

    :param start: inclusive start (aware datetime, ISO string or unix ns).
    :param end: exclusive end.
    :raises ValueError: naive datetimes, or ``end <= start``.
    """
    return str(IntervalId("time", *_ordered_ns(start, end, ("start", "end"))))


@dataclass(frozen=True)
class Interval:
    """A time interval ``[start_ns, end_ns)`` in unix ns, checked when built: the one value the
    ETL's plan, the fetch and the rebuild pass around (instead of bounds dicts or ID strings).

    :ivar start_ns: inclusive start (unix ns, >= 0). :ivar end_ns: exclusive end (> ``start_ns``).
    """

    start_ns: int
    end_ns: int

    def __post_init__(self) -> None:
        for name in ("start_ns", "end_ns"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"Interval.{name} must be int unix ns, got {type(value).__name__}: {value!r}")
        _ordered_ns(self.start_ns, self.end_ns, ("start", "end"))

    @classmethod
    def of(cls, start: datetime | int | str, end: datetime | int | str) -> Interval:
        """The interval ``[start, end)`` (aware datetimes, ISO strings or unix ns; :func:`to_ns`).

        :raises ValueError: naive datetimes, unparseable strings, or ``end <= start``.
        """
        return cls(*_ordered_ns(start, end, ("start_time", "end_time")))

    @classmethod
    def from_id(cls, value: str | IntervalId) -> Interval:
        """The interval of a time interval ID ``{start}_{end}`` (:func:`interval_id`).

        :raises ValueError: not a time interval ID (sequence and durable IDs name no times).
        """
        key = IntervalId.parse(value)
        if key.window is None:
            raise ValueError(f"interval ID {value!r} names a {key.kind} range, not a time interval "
                             "(expected <start>_<end>)")
        return key.window

    @classmethod
    def from_bounds(cls, bounds: Any) -> Interval:
        """The interval of stored time bounds (:meth:`bounds`: a manifest's or the ledger's ``bounds``).

        :raises ValueError: bounds of another kind (sequence, durable).
        """
        if bounds.get("kind") != "time":
            raise ValueError(f"bounds {dict(bounds)!r} are not time bounds")
        return cls(int(bounds["start_ns"]), int(bounds["end_ns"]))

    @property
    def id(self) -> str:
        """The folder ID ``{start}_{end}`` (:func:`interval_id`)."""
        return str(self.key)

    @property
    def key(self) -> IntervalId:
        """The :class:`IntervalId` of this interval."""
        return IntervalId("time", self.start_ns, self.end_ns)

    def bounds(self) -> dict[str, Any]:
        """The bounds as the staging manifests and the ledger store them: ``{"kind": "time",
        "start_ns", "end_ns" (unix ns), "start", "end" (RFC 3339 UTC)}``."""
        return {"kind": "time", "start_ns": self.start_ns, "end_ns": self.end_ns,
                "start": ns_to_rfc3339(self.start_ns), "end": ns_to_rfc3339(self.end_ns)}


def _check_seq_range(first_seq: int, last_seq: int) -> None:
    if isinstance(first_seq, bool) or isinstance(last_seq, bool):
        raise TypeError("stream sequences must be integers")
    if int(first_seq) < 1 or int(last_seq) < int(first_seq):
        raise ValueError(f"invalid stream sequence range [{first_seq}, {last_seq}]: expected 1 <= first <= last")


def seq_interval_id(first_seq: int, last_seq: int) -> str:
    """Return the folder ID of a stream-sequence range ``[first_seq, last_seq]``: ``seq-{first:012d}-{last:012d}``.

    :raises ValueError: a sequence below 1, or ``last_seq < first_seq``.
    """
    _check_seq_range(first_seq, last_seq)
    return str(IntervalId("seq", int(first_seq), int(last_seq)))


def durable_interval_id(first_seq: int, last_seq: int) -> str:
    """Return the folder ID of a durable-consumer batch that read ``[first_seq, last_seq]``: ``durable-…``.

    :raises ValueError: a sequence below 1, or ``last_seq < first_seq``.
    """
    _check_seq_range(first_seq, last_seq)
    return str(IntervalId("durable", int(first_seq), int(last_seq)))


#: The kinds of interval IDs: a time interval, a stream-sequence range, a durable consumer's batch.
INTERVAL_KINDS = ("time", "seq", "durable")

_EXPECTED_ID = "expected <start>_<end>, seq-<first>-<last> or durable-<first>-<last>"


@total_ordering
@dataclass(frozen=True, eq=False)
class IntervalId:
    """An interval ID, parsed: the one value type of interval IDs (:meth:`parse` reads the text,
    ``str()`` writes it back; the text is used only at the JSON, XCom and path edges).

    IDs of one kind sort in stream order (start, then end); kinds sort apart (``durable`` <
    ``seq`` < ``time``), and only IDs of one kind are in one chain (:meth:`precedes`). An ID is
    equal to, and hashes as, its text, so IDs read from JSON or a Delta log find it in sets and dicts.

    :ivar kind: ``"time"``, ``"seq"`` or ``"durable"``.
    :ivar low: the start (unix ns) of a time interval, else the first stream sequence.
    :ivar high: the end (unix ns, exclusive) of a time interval, else the last stream sequence (inclusive).
    :raises ValueError: an unknown kind, or bounds out of order (names them).
    """

    kind: str
    low: int
    high: int

    def __post_init__(self) -> None:
        if self.kind not in INTERVAL_KINDS:
            raise ValueError(f"interval ID kind {self.kind!r} is not one of {INTERVAL_KINDS}")
        for name in ("low", "high"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"IntervalId.{name} must be int, got {type(value).__name__}: {value!r}")
        if self.kind == "time":
            _ordered_ns(self.low, self.high, ("start", "end"))
        else:
            _check_seq_range(self.low, self.high)

    @classmethod
    def parse(cls, value: str | IntervalId, what: str = "staging interval ID") -> IntervalId:
        """Parse an interval ID (:func:`interval_id`, :func:`seq_interval_id`,
        :func:`durable_interval_id`); an :class:`IntervalId` is returned as it is.

        :param what: what the value is, for the error message.
        :raises ValueError: the value is not an interval ID in its one spelling, the form these functions write
            (names the value and the expected forms).
        """
        if isinstance(value, IntervalId):
            return value
        try:
            if value.startswith(("seq-", "durable-")):
                kind, first, last = value.split("-")
                parsed = cls(kind, int(first), int(last))
            else:
                start, end = value.split("_")
                parsed = cls("time", _parse_compact(start), _parse_compact(end))
        except (ValueError, AttributeError, TypeError):
            raise ValueError(f"not a {what}: {value!r} ({_EXPECTED_ID})") from None
        if str(parsed) != value:
            raise ValueError(f"not a {what} in its one spelling: {value!r} (expected {str(parsed)!r})")
        return parsed

    @classmethod
    def parse_or_none(cls, value: Any) -> IntervalId | None:
        """:meth:`parse`, or None for a value that is not an interval ID (a foreign folder or partition)."""
        try:
            return cls.parse(value)
        except ValueError:
            return None

    @classmethod
    def of_window(cls, window: Interval) -> IntervalId:
        """The ID of a time interval."""
        return cls("time", window.start_ns, window.end_ns)

    def __repr__(self) -> str:
        return f"IntervalId({str(self)!r})"

    def __str__(self) -> str:
        if self.kind == "time":
            return f"{compact_time(self.low)}_{compact_time(self.high)}"
        return f"{self.kind}-{self.low:012d}-{self.high:012d}"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, IntervalId):
            return (self.kind, self.low, self.high) == (other.kind, other.low, other.high)
        if isinstance(other, str):
            return str(self) == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(str(self))

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, IntervalId):
            return NotImplemented
        return (self.kind, self.low, self.high) < (other.kind, other.low, other.high)

    @property
    def stop(self) -> int:
        """The exclusive end: ``high`` of a time interval, ``high + 1`` of a sequence range."""
        return self.high if self.kind == "time" else self.high + 1

    @property
    def window(self) -> Interval | None:
        """The :class:`Interval` of a time interval ID; None for sequence and durable IDs."""
        return Interval(self.low, self.high) if self.kind == "time" else None

    def same_kind(self, other: IntervalId) -> bool:
        """True when both IDs are of one kind (comparable in one chain)."""
        return self.kind == other.kind

    def precedes(self, other: IntervalId) -> bool:
        """True when this interval is of ``other``'s kind and ends at or before ``other``'s start."""
        return self.kind == other.kind and self.stop <= other.low


#: The former name of :class:`IntervalId`.
IntervalKey = IntervalId


def parse_interval_key(value: str) -> IntervalId:
    """:meth:`IntervalId.parse` (the former name; warns ``DeprecationWarning``: this module has no Airflow).

    :raises ValueError: the value is not an interval ID of this module.
    """
    warnings.warn("times.parse_interval_key is deprecated: use times.IntervalId.parse", DeprecationWarning,
                  stacklevel=2)
    return IntervalId.parse(value)


def parse_interval_id(value: str) -> dict[str, Any]:
    """An interval ID's bounds as JSON: ``{"kind": "time", "start_ns", "end_ns"}``,
    ``{"kind": "seq", "first_seq", "last_seq"}`` or ``{"kind": "durable", "first_seq", "last_seq"}``
    (:meth:`IntervalId.parse`).

    :raises ValueError: the value is not an interval ID of this module.
    """
    key = IntervalId.parse(value)
    if key.kind == "time":
        return {"kind": "time", "start_ns": key.low, "end_ns": key.high}
    return {"kind": key.kind, "first_seq": key.low, "last_seq": key.high}


def interval_kind(value: str | IntervalId) -> str:
    """``"time"`` for ``<start>_<end>`` IDs, else ``"seq"``/``"durable"`` (:attr:`IntervalId.kind`).

    :raises ValueError: not an interval ID."""
    return IntervalId.parse(value).kind


def interval_end_epoch(value: str | IntervalId) -> float | None:
    """The end of a time interval ID in epoch seconds; None for sequence/durable IDs and other text."""
    key = IntervalId.parse_or_none(value)
    return key.high / NS_PER_S if key is not None and key.kind == "time" else None
