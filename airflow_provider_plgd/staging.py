"""The staging layout and manifest contract: raw JetStream messages as Parquet, one folder per batch.

This module is the one home of the staging contract (``docs/architecture.md``, "Staging contract").
The fetch operator writes it and the Spark applications read it, so it imports only pyarrow and
fsspec (no Airflow, no Spark) and can ship to Spark executors with ``--py-files``.

Layout (``{root}`` is a local path or any fsspec URL: ``/data/plgd``, ``file:///…``, ``memory://…``,
``s3://bucket/plgd``)::

    {root}/staging/{stream}/owner_id={owner_id}/event_type={event_type}/interval={interval_id}/
        part-00000.parquet
        part-00001.parquet
        part-00000-f1.parquet   <- files of the second subject filter (part_name)
        _manifest.json          <- the commit marker, written last

A batch fetched in several stream-sequence ranges (the ETL's fetch tasks, one per range) is
committed in **fragments**, one per range, in the same folder: fragment ``r0003`` has its own
``_manifest-r0003.json`` and part files ``part-r0003-00000.parquet``, … (:func:`fragment_name`),
and its writer touches only its own files. The interval ledger names the fragments each fetch
task committed; the ETL's decode reads exactly those::

    {root}/staging/{stream}/owner_id={owner_id}/event_type={event_type}/interval={interval_id}/
        part-r0000-00000.parquet
        _manifest-r0000.json
        part-r0003-00000.parquet
        _manifest-r0003.json

Batches of an arbitrary subject filter (not one owner x one event type) use the placeholder
owner ``_filter`` and, as event type, a key derived from the filters (:func:`filter_key`,
``f`` + 16 hex digits of a SHA-256), so every batch folder has the same depth and two different
filters never share a folder::

    {root}/staging/{stream}/owner_id=_filter/event_type=f0123456789abcdef/interval={interval_id}/

Interval IDs (:mod:`airflow_provider_plgd.times`: ``interval_id``, ``seq_interval_id``, ``durable_interval_id``):

* time bounds ``[start, end)``: ``20260101T000000Z_20260101T010000Z``; a fraction is added only
  when needed: ``.ffffff`` (microseconds) or ``.fffffffff`` (nanoseconds, int bounds only).
* stream-sequence range ``[first, last]``: ``seq-000000000001-000000001000``.
* durable-consumer batch: ``durable-{first_seq:012d}-{last_seq:012d}`` (the sequences read).

Parquet schema (:data:`SCHEMA`, exact; ``published_at`` is microseconds because Spark 4 cannot read
``TIMESTAMP(NANOS)``; the exact nanosecond bounds live in the manifest):

=============  ===========================  =====================================================
column         Arrow type                   meaning
=============  ===========================  =====================================================
stream         string, not null             JetStream stream name
stream_seq     int64, not null              stream sequence
subject        string, not null             NATS subject (docs/wire-format.md §1)
published_at   timestamp[us, tz=UTC]        JetStream server timestamp, truncated to microseconds
msg_id         string, nullable             the ``Nats-Msg-Id`` header (plgd sets none)
headers        map<string, string>, null    all NATS headers, null when the message has none
data           binary, not null             the payload exactly as stored (docs/wire-format.md §2)
=============  ===========================  =====================================================

Commit protocol (:class:`StagingWriter`): (1) a rerun first deletes the folder's old
``_manifest.json``, so the folder is uncommitted while it is rewritten; (2) each part file is
written under a temporary name (``.part-NNNNN.parquet.inprogress``) and renamed; on object stores
(s3, gcs, azure, …) where one PUT is atomic and a rename is a copy, it is written under its final
name; (3) ``_manifest.json`` is written last and atomically (temporary name + rename locally, one
PUT on object stores); (4) files in the folder that the manifest does not list are deleted.
Readers (:func:`list_committed`, :func:`read_manifest`) see only folders with a manifest, and only
the files that manifest lists. Output is deterministic: the same messages give byte-identical part
files and manifest, so a rerun replaces the folder with identical content.
"""

from __future__ import annotations

import hashlib
import posixpath
import unicodedata
import uuid
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from itertools import accumulate
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_provider_plgd import DISTRIBUTION_NAME, __version__
from airflow_provider_plgd.storage import (  # the storage layer, one home
    STALE_INPROGRESS_S,
    atomic_rename_ok,
    io_error_with_path,
    is_local,
    join_path,
    location_url,
    read_json_document,
    to_fs,
    write_json,
    younger_than,
)

#: Folder under the storage root that holds all staging datasets.
STAGING_DIR = "staging"
#: Name of the commit marker in each batch folder.
MANIFEST_NAME = "_manifest.json"
#: Version of the manifest format (bump on an incompatible change).
MANIFEST_VERSION = 1
#: Fragment names: ``r`` and the range index, at least 4 digits (:func:`fragment_name`).
FRAGMENT_PREFIX = "r"
#: ``owner_id`` partition value of a batch fetched with an arbitrary subject filter.
FILTER_OWNER = "_filter"
#: ``created_by`` of every manifest (no timestamps, so reruns are byte-identical).
CREATED_BY = f"{DISTRIBUTION_NAME} {__version__}"

#: The staging Parquet schema (see the module docstring for the meaning of each column).
SCHEMA = pa.schema(
    [
        pa.field("stream", pa.string(), nullable=False),
        pa.field("stream_seq", pa.int64(), nullable=False),
        pa.field("subject", pa.string(), nullable=False),
        pa.field("published_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("msg_id", pa.string(), nullable=True),
        pa.field("headers", pa.map_(pa.string(), pa.string()), nullable=True),
        pa.field("data", pa.binary(), nullable=False),
    ]
)

#: NATS header that carries the message ID (JetStream de-duplication).
MSG_ID_HEADER = "Nats-Msg-Id"

# Path separators, the partition key/value separator, parent references, and glob characters
# (list_committed globs with these values).
_FORBIDDEN_IN_PARTITION = ("/", "\\", "=", "..", "*", "?", "[", "]")


# --------------------------------------------------------------------------------------------------
# Interval IDs and paths
# --------------------------------------------------------------------------------------------------
def filter_key(subject_filters: Sequence[str]) -> str:
    """Return the ``event_type`` partition value of a batch with arbitrary subject filters.

    ``"f"`` + the first 16 hex digits of SHA-256 over the filters joined by ``"\\n"`` (order kept).

    :raises ValueError: no filters.
    """
    filters = as_filter_list(subject_filters)
    return "f" + hashlib.sha256("\n".join(filters).encode()).hexdigest()[:16]


def as_filter_list(subject_filters: str | Sequence[str]) -> list[str]:
    """``subject_filters`` (one string or a sequence) as a list. :raises ValueError: empty, or a non-str/blank item."""
    filters = [subject_filters] if isinstance(subject_filters, str) else list(subject_filters)
    if not filters or not all(isinstance(f, str) and f.strip() for f in filters):
        raise ValueError(f"subject filters must be a non-empty list of subjects, got {subject_filters!r}")
    return filters


def validate_partition_value(value: object, what: str) -> str:
    """Check that ``value`` is safe as one path segment under the storage root: a partition folder
    value (``owner_id=…``, ``event_type=…``, ``interval=…``), the ``{stream}`` folder, or a file name
    listed in a manifest.

    :return: the value unchanged.
    :raises ValueError: (naming ``what`` and the value) not a non-empty str, ``"."``, or contains
        ``/``, ``\\``, ``=``, ``..``, ``*``, ``?``, ``[``, ``]``, whitespace, or control/format
        characters (Unicode category C: NUL, DEL, U+202E, ...).
    """
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    if (
        value == "."
        or any(bad in value for bad in _FORBIDDEN_IN_PARTITION)
        or any(c.isspace() or ord(c) < 32 or unicodedata.category(c).startswith("C") for c in value)
    ):
        raise ValueError(
            f"{what} {value!r} cannot be used in a staging path "
            "(no '/', '\\', '=', '..', '*', '?', '[', ']', whitespace or control characters; not '.')"
        )
    return value


def stream_path(root: str, stream: str) -> str:
    """Return ``{root}/staging/{stream}`` (string join; works for paths and URLs)."""
    return join_path(str(root), STAGING_DIR, validate_partition_value(stream, "stream"))


def batch_path(root: str, stream: str, owner_id: str, event_type: str, interval: str) -> str:
    """Return the folder of one batch: ``{root}/staging/{stream}/owner_id=…/event_type=…/interval=…``.

    :raises ValueError: a value that is not safe in a path (:func:`validate_partition_value`).
    """
    return join_path(
        stream_path(root, stream),
        f"owner_id={validate_partition_value(owner_id, 'owner_id')}",
        f"event_type={validate_partition_value(event_type, 'event_type')}",
        f"interval={validate_partition_value(interval, 'interval_id')}",
    )


def fragment_name(range_index: int) -> str:
    """The fragment of a batch fetched in stream-sequence range ``range_index`` (>= 0): ``r0003``.

    :raises ValueError: not an int >= 0.
    """
    if isinstance(range_index, bool) or not isinstance(range_index, int) or range_index < 0:
        raise ValueError(f"range index must be an int >= 0, got {range_index!r}")
    return f"{FRAGMENT_PREFIX}{range_index:04d}"


def _check_fragment(fragment: str | None) -> str | None:
    if fragment is None:
        return None
    digits = fragment[len(FRAGMENT_PREFIX):] if isinstance(fragment, str) else ""
    if not (fragment.startswith(FRAGMENT_PREFIX) and len(digits) >= 4 and digits.isdigit() and digits.isascii()):
        raise ValueError(f"fragment must be 'r' and at least 4 digits (fragment_name), got {fragment!r}")
    return fragment


def manifest_name(fragment: str | None = None) -> str:
    """``_manifest.json``, or ``_manifest-{fragment}.json`` for a fragment (:func:`fragment_name`)."""
    return MANIFEST_NAME if fragment is None else f"_manifest-{_check_fragment(fragment)}.json"


def _fragment_of(name: str) -> str | None:
    """The fragment a file name of a batch folder belongs to (None: the unfragmented batch)."""
    for prefix in ("_manifest-", "part-", ".part-"):
        if name.startswith(prefix + FRAGMENT_PREFIX):
            head = name[len(prefix):].split("-", 1)[0].split(".", 1)[0]
            try:
                return _check_fragment(head)
            except ValueError:
                return None
    return None


def part_name(index: int, filter_index: int = 0, fragment: str | None = None) -> str:
    """Return the name of part file ``index`` of the batch's filter ``filter_index``:
    ``part-00000.parquet`` for the first filter (the only one of most batches),
    ``part-00000-f1.parquet`` for the second, and so on; a fragment's files start with
    ``part-{fragment}-`` (``part-r0003-00000.parquet``)."""
    suffix = f"-f{int(filter_index)}" if filter_index else ""
    head = f"{_check_fragment(fragment)}-" if fragment is not None else ""
    return f"part-{head}{int(index):05d}{suffix}.parquet"


# --------------------------------------------------------------------------------------------------
# Writer
# --------------------------------------------------------------------------------------------------
class _FilterPart:
    """Writing state of one subject filter of a batch: its statistics, pending row group and open part file."""

    def __init__(self, index: int, subject_filter: str) -> None:
        self.index = index
        self.stats: dict[str, Any] = {"subject_filter": subject_filter, "count": 0, "bytes": 0,
                                      "first_seq": None, "last_seq": None}
        self.files: list[dict[str, Any]] = []  # closed part files, in order
        self.writer: pq.ParquetWriter | None = None
        self.sink: Any = None
        self.tmp_path: str | None = None
        self.file_info: dict[str, Any] | None = None
        self.reset_pending()

    def reset_pending(self) -> None:
        self.p_seq: list[int] = []
        self.p_subject: list[str] = []
        self.p_time: list[int] = []
        self.p_headers: list[Mapping[str, str] | None] = []
        self.p_data: list[bytes] = []
        self.p_rows = 0
        self.p_bytes = 0

    def file_rows(self) -> int:
        return self.file_info["rows"] if self.file_info else 0


class StagingWriter:
    """Stream the messages of one batch into Parquet part files of one staging folder and commit it.

    Usage (one writer per batch folder), filter after filter::

        with StagingWriter(root, stream="EVENTS", owner_id=o, event_type=et, interval_id=iid,
                           subject_filters=filters, bounds=bounds) as writer:
            for subject_filter in filters:
                writer.start_filter(subject_filter)
                for batch in batches_of(subject_filter):
                    writer.write(batch)
            manifest = writer.commit()

    or with the messages of all filters as they come (one consumer for several filters):
    ``writer.write(batch, filter_index=i)`` for the messages of ``subject_filters[i]``, in any
    interleaving. Both give the same files: each filter has its own sequence of part files
    (:func:`part_name`), and its cut points depend only on its own messages.

    ``write`` takes a sequence of messages, each a 5-tuple in the field order of
    ``hooks.jetstream.StreamMessage``: ``(stream_seq: int, subject: str, time_ns: int (server time,
    unix ns), headers: dict[str, str] | None, data: bytes)``; sequences strictly increase within
    a filter. Rows are buffered only up to one row group per filter (``row_group_size`` rows or
    ``row_group_bytes`` payload bytes, whichever comes first), then written, so memory stays flat
    however large the batch: at most one row group per filter that has pending rows. A part file
    is closed after ``max_rows_per_file`` rows, at :meth:`start_filter` (the previous filter's
    last file) and at :meth:`commit`. The manifest lists the files filter by filter.

    Leaving the ``with`` block with an exception (or calling :meth:`abort`) leaves the folder
    uncommitted: no manifest; :meth:`commit` of a later run cleans up.

    :param root: storage root (path, fsspec URL or ``ObjectStoragePath``); see :func:`to_fs`.
    :param stream: stream name (the ``stream`` column and the ``{stream}`` folder).
    :param owner_id: ``owner_id`` partition value (``FILTER_OWNER`` for arbitrary filters).
    :param event_type: ``event_type`` partition value (:func:`filter_key` for arbitrary filters).
    :param interval_id: the interval folder ID (:func:`interval_id` and friends).
    :param subject_filters: the JetStream filter subjects of the batch, in fetch order.
    :param bounds: JSON-able description of the bounds, stored in the manifest as is
        (e.g. ``{"kind": "time", "start_ns", "end_ns", "start", "end"}``).
    :param row_group_size: rows per Parquet row group (default 50,000).
    :param row_group_bytes: payload bytes per row group before it is cut early (default 32 MiB).
    :param max_rows_per_file: rows per part file (default 1,000,000).
    :param compression: Parquet codec (default ``"snappy"``; payloads are already snappy-compressed).
    :param fragment: commit this writer's rows as one fragment of the batch (:func:`fragment_name`;
        the fetch of one stream-sequence range); None: the whole batch.
    :raises ValueError: bad partition values or fragment, sizes below 1.
    :raises OSError: (from any method) a file system error; the message names the path
        (:func:`io_error_with_path`).
    """

    def __init__(
        self,
        root: Any,
        *,
        stream: str,
        owner_id: str,
        event_type: str,
        interval_id: str,
        subject_filters: Sequence[str],
        bounds: Mapping[str, Any],
        row_group_size: int = 50_000,
        row_group_bytes: int = 32 * 1024 * 1024,
        max_rows_per_file: int = 1_000_000,
        compression: str = "snappy",
        fragment: str | None = None,
    ) -> None:
        for name, value in (
            ("row_group_size", row_group_size),
            ("row_group_bytes", row_group_bytes),
            ("max_rows_per_file", max_rows_per_file),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.fs, self.root_path = to_fs(root)
        self.stream = stream
        self.owner_id = owner_id
        self.event_type = event_type
        self.interval_id = interval_id
        self.subject_filters = as_filter_list(subject_filters)
        self.bounds = dict(bounds)
        self.folder = batch_path(self.root_path, stream, owner_id, event_type, interval_id)
        self.fragment = _check_fragment(fragment)
        self.manifest_name = manifest_name(self.fragment)
        self.row_group_size = row_group_size
        self.row_group_bytes = row_group_bytes
        self.max_rows_per_file = max_rows_per_file
        self.compression = compression
        self._local = is_local(self.fs)
        self._rename = atomic_rename_ok(self.fs)
        self._stream_scalar = pa.scalar(stream, pa.string())
        #: names this writer's temporary files, so two writers of one folder never share one
        self._writer_id = uuid.uuid4().hex[:12]
        self._opened = False
        self._committed = False
        self._parts: dict[int, _FilterPart] = {}  # by filter index
        self._current: int | None = None  # filter of start_filter()/write() without filter_index

    # -- context manager ----------------------------------------------------------------------
    def __enter__(self) -> StagingWriter:
        self.open()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None or not self._committed:
            self.abort()

    @property
    def url(self) -> str:
        """The batch folder as a path (local) or URL (other file systems)."""
        return location_url(self.fs, self.folder)

    @property
    def count(self) -> int:
        """Rows written so far (including pending row groups)."""
        return sum(p.stats["count"] for p in self._parts.values())

    @property
    def data_bytes(self) -> int:
        """Payload bytes written so far (sum of ``len(data)``)."""
        return sum(p.stats["bytes"] for p in self._parts.values())

    @property
    def pending_bytes(self) -> int:
        """Payload bytes buffered for row groups not written yet."""
        return sum(p.p_bytes for p in self._parts.values())

    def flush(self, *, close: bool = False) -> None:
        """Write the pending rows now, as row groups (for a caller's memory budget over many writers:
        the rows and their order are unchanged, only row groups are cut earlier).

        :param close: also close the open part files (the next rows start a new part file), so a
            caller with many writers holds no file open between flushes.
        """
        self._require_uncommitted()
        for part in self._parts.values():
            self._flush_row_group(part)
            if close:
                self._close_file(part)

    def open(self) -> None:
        """Start the batch on storage: create the folder (where folders exist) and delete an old
        ``_manifest.json`` (the folder is now uncommitted), or only the fragment's own manifest.

        Called by the ``with`` block; without it, the first part file or :meth:`commit` calls it,
        so a writer whose rows stay buffered until the commit touches storage only then (one
        delete, the part files, the manifest and one listing on an object store).
        """
        if self._opened:
            return
        manifest = join_path(self.folder, self.manifest_name)
        with io_error_with_path(self.fs, self.folder, "create the staging folder"):
            if self._rename:  # a file system with folders; object stores have none to create
                self.fs.makedirs(self.folder, exist_ok=True)
            try:
                self.fs.rm_file(manifest)  # one request; deleting a missing key is no error on S3
            except FileNotFoundError:
                pass
        self._opened = True

    def start_filter(self, subject_filter: str) -> None:
        """Begin the rows of the next subject filter (closes the previous filter's part file).

        :raises ValueError: the filter is not the next one of ``subject_filters``.
        """
        self._require_uncommitted()
        index = 0 if self._current is None else self._current + 1
        if index >= len(self.subject_filters) or self.subject_filters[index] != subject_filter:
            raise ValueError(
                f"filter {subject_filter!r} is not the next subject filter of this batch "
                f"(expected order {self.subject_filters})"
            )
        if self._current is not None:
            self._finish_part(self._parts[self._current])
        self._current = index
        self._part(index)

    def write(self, messages: Sequence[Sequence[Any]], filter_index: int | None = None) -> None:
        """Append messages of one filter (5-tuples, see the class docstring).

        :param filter_index: index of their filter in ``subject_filters``; default the filter of
            the last :meth:`start_filter` (the only filter, when there is one).
        :raises ValueError: no filter given or started when a batch has several; a bad index;
            sequences not strictly increasing within a filter.
        """
        self._require_uncommitted()
        if filter_index is None:
            if self._current is None:
                if len(self.subject_filters) == 1:
                    self.start_filter(self.subject_filters[0])
                else:
                    raise ValueError("call start_filter() before write() when a batch has several subject filters")
            filter_index = self._current
            assert filter_index is not None  # start_filter() set it
        elif isinstance(filter_index, bool) or not 0 <= filter_index < len(self.subject_filters):
            raise ValueError(f"filter_index {filter_index!r} is not an index of {self.subject_filters}")
        if not messages:
            return
        part = self._part(filter_index)
        seqs, subjects, times, headers, datas = zip(*messages)
        stats = part.stats
        last = stats["last_seq"]
        if (last is not None and seqs[0] <= last) or any(a >= b for a, b in zip(seqs, seqs[1:])):
            raise ValueError(
                f"stream sequences must strictly increase within filter {stats['subject_filter']!r} "
                f"(got {seqs[0]} after {last})"
            )
        lens = [len(d) for d in datas]
        cum = list(accumulate(lens))
        n = len(seqs)
        stats["count"] += n
        stats["bytes"] += cum[-1]
        if stats["first_seq"] is None:
            stats["first_seq"] = seqs[0]
        stats["last_seq"] = seqs[-1]

        i = 0
        while i < n:
            # rows the pending row group may hold: a full group, or what is left of the part file
            limit_rows = min(self.row_group_size, self.max_rows_per_file - part.file_rows())
            room_rows = limit_rows - part.p_rows
            base = cum[i - 1] if i else 0
            budget = self.row_group_bytes - part.p_bytes
            # take the messages that fit the byte budget (a row group always gets >= 1 row)
            k = bisect_right(cum, base + budget, lo=i, hi=min(n, i + room_rows)) - i
            if k == 0 and part.p_rows == 0:
                k = 1
            if k:
                j = i + k
                part.p_seq.extend(seqs[i:j])
                part.p_subject.extend(subjects[i:j])
                part.p_time.extend(times[i:j])
                part.p_headers.extend(headers[i:j])
                part.p_data.extend(datas[i:j])
                part.p_rows += k
                part.p_bytes += cum[j - 1] - base
                i = j
            # a cut inside this batch, or a full group: write it (cut points depend only on content)
            if i < n or part.p_rows >= limit_rows or part.p_bytes >= self.row_group_bytes:
                self._flush_row_group(part)
                if part.file_rows() >= self.max_rows_per_file:
                    self._close_file(part)

    def commit(self) -> dict[str, Any]:
        """Close the last part files, write ``_manifest.json`` atomically, and delete stray files.

        :return: the manifest (see :func:`read_manifest`), plus ``"folder"`` (where it was written).
        """
        self._require_uncommitted()
        self.open()
        for part in self._parts.values():
            self._finish_part(part)
        filters = [self._parts[i].stats if i in self._parts else _FilterPart(i, sf).stats
                   for i, sf in enumerate(self.subject_filters)]
        files = [info for i in sorted(self._parts) for info in self._parts[i].files]
        nonempty = [f for f in filters if f["count"]]
        manifest: dict[str, Any] = {
            "version": MANIFEST_VERSION,
            "stream": self.stream,
            "owner_id": self.owner_id,
            "event_type": self.event_type,
            "interval_id": self.interval_id,
            "subject_filters": list(self.subject_filters),
            "fragment": self.fragment,
            "bounds": self.bounds,
            "first_seq": min(f["first_seq"] for f in nonempty) if nonempty else None,
            "last_seq": max(f["last_seq"] for f in nonempty) if nonempty else None,
            "count": self.count,
            "bytes": self.data_bytes,
            "filters": [dict(f) for f in filters],
            "files": [dict(f) for f in files],
            "schema": [f"{field.name}:{field.type}" for field in SCHEMA],
            "created_by": CREATED_BY,
        }
        target = join_path(self.folder, self.manifest_name)
        with io_error_with_path(self.fs, target, "write the manifest"):
            write_json(target, manifest, fs=self.fs)
        self._committed = True
        keep = {self.manifest_name} | {f["path"] for f in files}
        with io_error_with_path(self.fs, self.folder, "remove stray files from"):
            for entry in self.fs.ls(self.folder, detail=False):
                name = posixpath.basename(str(entry).rstrip("/"))
                if _fragment_of(name) != self.fragment:
                    continue  # another fragment's file: its own writer cleans it up
                if name in keep or (name.endswith(".inprogress") and self._writer_id not in name
                                    and younger_than(self.fs, entry, STALE_INPROGRESS_S)):
                    continue  # another writer's file in progress (a concurrent run of this batch)
                self.fs.rm(entry, recursive=True)
        return {**manifest, "folder": self.url}

    def abort(self) -> None:
        """Stop without committing: close and delete the part files in progress (best effort)."""
        for part in self._parts.values():
            writer, sink, tmp = part.writer, part.sink, part.tmp_path
            part.writer = part.sink = part.tmp_path = part.file_info = None
            part.reset_pending()
            try:
                if writer is not None:
                    writer.close()
                if sink is not None:
                    sink.close()
            except Exception:  # noqa: BLE001 - best effort on the error path
                pass
            if tmp is not None:
                try:
                    self.fs.rm(tmp)
                except Exception:  # noqa: BLE001
                    pass

    # -- internals ------------------------------------------------------------------------------
    def _require_uncommitted(self) -> None:
        if self._committed:
            raise ValueError(f"batch {self.url} is already committed")

    def _part(self, index: int) -> _FilterPart:
        part = self._parts.get(index)
        if part is None:
            part = self._parts[index] = _FilterPart(index, self.subject_filters[index])
        return part

    def _finish_part(self, part: _FilterPart) -> None:
        self._flush_row_group(part)
        self._close_file(part)

    def _open_file(self, part: _FilterPart) -> None:
        self.open()
        name = part_name(len(part.files), part.index, self.fragment)
        tmp = join_path(self.folder, f".{name}.{self._writer_id}.inprogress") if self._rename else join_path(self.folder, name)
        with io_error_with_path(self.fs, tmp, "open the part file"):
            if self._local:
                part.sink = None
                where: Any = tmp
            else:
                part.sink = self.fs.open(tmp, "wb")
                where = part.sink
            part.writer = pq.ParquetWriter(
                where,
                SCHEMA,
                compression=self.compression,
                use_dictionary=["stream", "subject", "msg_id"],
                write_statistics=["stream", "stream_seq", "subject", "published_at"],
            )
        part.tmp_path = tmp
        part.file_info = {
            "path": name,
            "rows": 0,
            "bytes": 0,
            "data_bytes": 0,
            "subject_filter": part.stats["subject_filter"],
            "first_seq": None,
            "last_seq": None,
        }

    def _close_file(self, part: _FilterPart) -> None:
        if part.writer is None:
            return
        info, tmp = part.file_info, part.tmp_path
        assert info is not None  # set together with part.writer by _open_file
        final = join_path(self.folder, info["path"])
        size = None
        with io_error_with_path(self.fs, tmp, "close the part file"):
            part.writer.close()
            if part.sink is not None:
                size = part.sink.tell()  # the bytes written, without asking the object store
                part.sink.close()
        with io_error_with_path(self.fs, final, "rename the part file to"):
            if tmp != final:
                self.fs.mv(tmp, final)
            info["bytes"] = int(self.fs.size(final) if size is None else size)
        part.files.append(info)
        part.writer = part.sink = part.tmp_path = part.file_info = None

    def _flush_row_group(self, part: _FilterPart) -> None:
        if part.p_rows == 0:
            return
        if part.writer is None:
            self._open_file(part)
        writer, info = part.writer, part.file_info
        assert writer is not None and info is not None  # _open_file set them
        n = part.p_rows
        headers = part.p_headers
        if any(h for h in headers):
            msg_ids = [h.get(MSG_ID_HEADER) if h else None for h in headers]
            header_arr = pa.array([list(h.items()) if h else None for h in headers], SCHEMA.field("headers").type)
            msg_arr = pa.array(msg_ids, pa.string())
        else:
            header_arr = pa.nulls(n, SCHEMA.field("headers").type)
            msg_arr = pa.nulls(n, pa.string())
        # ns -> us, truncated (times are positive, so Arrow's integer division truncates like //)
        times_us = pc.divide(pa.array(part.p_time, pa.int64()), pa.scalar(1000, pa.int64())).cast(
            SCHEMA.field("published_at").type
        )
        table = pa.Table.from_arrays(
            [
                pa.repeat(self._stream_scalar, n),
                pa.array(part.p_seq, pa.int64()),
                pa.array(part.p_subject, pa.string()),
                times_us,
                msg_arr,
                header_arr,
                pa.array(part.p_data, pa.binary()),
            ],
            schema=SCHEMA,
        )
        with io_error_with_path(self.fs, part.tmp_path, "write the part file"):
            writer.write_table(table, row_group_size=n)
        info["rows"] += n
        info["data_bytes"] += part.p_bytes
        if info["first_seq"] is None:
            info["first_seq"] = part.p_seq[0]
        info["last_seq"] = part.p_seq[-1]
        part.reset_pending()


# --------------------------------------------------------------------------------------------------
# Readers
# --------------------------------------------------------------------------------------------------
def read_manifest(path: Any, fragment: str | None = None) -> dict[str, Any]:
    """Read one ``_manifest.json`` (or a fragment's ``_manifest-{fragment}.json``).

    :param path: the manifest file, or its batch folder (path, fsspec URL or ``ObjectStoragePath``).
    :param fragment: with a folder: read this fragment's manifest (:func:`fragment_name`).
    :return: the manifest dict (fields: ``version``, ``stream``, ``owner_id``, ``event_type``,
        ``interval_id``, ``subject_filters``, ``fragment`` (None or the fragment name), ``bounds``, ``first_seq``, ``last_seq`` (int or None),
        ``count`` (rows), ``bytes`` (sum of payload lengths), ``filters`` (per filter: count, bytes,
        first/last seq), ``files`` (``[{path, rows, bytes (file size), data_bytes, subject_filter,
        first_seq, last_seq}]``, paths relative to the folder), ``schema``, ``created_by``), plus
        ``"folder"``: where the batch lives (path or URL; not stored in the file).
    :raises FileNotFoundError: no manifest there (the folder is not committed).
    :raises ValueError: not valid JSON, or a manifest version this code does not know.
    """
    fs, p = to_fs(path)
    name = posixpath.basename(p)
    if not (name == MANIFEST_NAME or (name.startswith("_manifest-") and name.endswith(".json"))):
        p = join_path(p, manifest_name(fragment))
    return _read_manifest(fs, p)


def _read_manifest(fs: fsspec.AbstractFileSystem, p: str) -> dict[str, Any]:
    where = location_url(fs, p)
    manifest = read_json_document(fs, p, "manifest", MANIFEST_VERSION)
    if manifest is None:
        raise FileNotFoundError(f"no committed manifest at {where}")
    for entry in manifest.get("files") or []:  # a tampered manifest must not point outside its folder
        path = entry.get("path") if isinstance(entry, dict) else None
        try:
            validate_partition_value(path, "file path")
        except ValueError:
            raise ValueError(f"manifest {where} lists file {path!r}, which is not a file name in its folder") from None
    manifest["folder"] = location_url(fs, posixpath.dirname(p))
    return manifest


def manifest_file_urls(manifest: Mapping[str, Any]) -> list[str]:
    """Return the data files of a manifest from :func:`read_manifest` as full paths/URLs, in order."""
    return [join_path(manifest["folder"], f["path"]) for f in manifest["files"]]


def list_committed(
    root: Any,
    stream: str,
    interval_id: str | None = None,
    owner_ids: Iterable[str] | None = None,
    event_types: Iterable[str] | None = None,
) -> list[dict[str, Any]]:
    """List the committed batches of a stream's staging dataset.

    A batch is committed when its folder holds ``_manifest.json``; only the files its manifest
    lists belong to it (anything else in the folder is a leftover of an interrupted run). A batch
    fetched in ranges is listed as its committed fragments, one manifest each; which fragments
    belong to the current run of an interval only the interval ledger says (the ETL's decode
    reads the ledger, not this listing).

    :param root: storage root (path, fsspec URL or ``ObjectStoragePath``).
    :param stream: stream name.
    :param interval_id: only this interval folder (exact ID); None = all.
    :param owner_ids: only these owners (partition values; ``"_filter"`` selects arbitrary-filter
        batches); None = all, including arbitrary-filter batches.
    :param event_types: only these event types; None = all.
    :return: manifests (see :func:`read_manifest`) sorted by (owner_id, event_type, interval_id).
        An empty list when nothing is committed (also when the dataset does not exist).
    """
    fs, base = to_fs(root)
    base = stream_path(base, stream)
    owners = None if owner_ids is None else {validate_partition_value(o, "owner_id") for o in owner_ids}
    types = None if event_types is None else {validate_partition_value(e, "event_type") for e in event_types}
    interval = "*" if interval_id is None else validate_partition_value(interval_id, "interval_id")
    owner_glob = next(iter(owners)) if owners is not None and len(owners) == 1 else "*"
    type_glob = next(iter(types)) if types is not None and len(types) == 1 else "*"
    pattern = join_path(base, f"owner_id={owner_glob}", f"event_type={type_glob}", f"interval={interval}",
                        "_manifest*.json")
    results = []
    for path in sorted(fs.glob(pattern)):
        parts = str(path).rstrip("/").split("/")
        owner, event_type = parts[-4].partition("=")[2], parts[-3].partition("=")[2]
        if parts[-1] != MANIFEST_NAME and _fragment_of(parts[-1]) is None:
            continue
        if (owners is not None and owner not in owners) or (types is not None and event_type not in types):
            continue
        results.append(_read_manifest(fs, str(path)))
    results.sort(key=lambda m: (m["owner_id"], m["event_type"], m["interval_id"], m.get("fragment") or ""))
    return results


def read_batch(manifest: Mapping[str, Any], fs: fsspec.AbstractFileSystem | None = None) -> pa.Table:
    """Read a committed batch into one Arrow table (for tests and small batches; Spark reads the files).

    :param manifest: a manifest from :func:`read_manifest` or :func:`list_committed`.
    :param fs: the file system to read with (default: resolved from ``manifest["folder"]``; pass it
        when the location needs credentials, e.g. an ``ObjectStoragePath`` root's ``.fs``).
    :return: a table with :data:`SCHEMA` (zero rows for an empty batch), rows in file order.
    """
    folder_fs, folder = to_fs(manifest["folder"])
    fs = fs or folder_fs
    tables = []
    for entry in manifest["files"]:
        with fs.open(join_path(folder, entry["path"]), "rb") as fh:
            tables.append(pq.read_table(fh, schema=SCHEMA))
    return pa.concat_tables(tables) if tables else SCHEMA.empty_table()
