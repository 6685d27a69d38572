"""The storage layer: every file of the project goes through fsspec, on the Airflow workers, the
Spark driver and the Spark tasks (staging, the interval ledger, run summaries, the Spark tables,
snapshots).

A root is a local path or any fsspec URL: ``s3://bucket/prefix`` with ``s3fs`` (the ``s3`` extra),
which reads ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and
``AWS_DEFAULT_REGION`` from the environment itself; nothing goes through the JVM, so Spark needs
no Hadoop cloud connector. Object stores have no atomic rename: :func:`write_bytes_atomic` writes
small documents with one PUT there; staging and the tables commit through their Delta logs
(:mod:`airflow_provider_plgd.tables.staging`, :mod:`airflow_provider_plgd.tables.delta_tables`).
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import fsspec

# Object stores: one PUT is atomic and a rename is a server-side copy, so write final names directly.
OBJECT_STORE_PROTOCOLS = frozenset(
    {"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl", "oss", "r2", "wasb", "wasbs", "oci", "cos"}
)


def join_path(base: Any, *parts: str) -> str:
    """``base/part/...`` with one ``/`` between (string join: works for local paths and fsspec URLs
    alike). The one path join of the storage layout (staging, ledger, run summaries)."""
    base = str(base)
    return posixpath.join(base.rstrip("/") if base not in ("/", "") else base, *parts)


@contextlib.contextmanager
def io_error_with_path(fs: fsspec.AbstractFileSystem | None, path: str | None, action: str) -> Iterator[None]:
    """Re-raise an ``OSError`` (pyarrow's ``ArrowIOError`` is one) of the block as an ``OSError``
    that names the path, e.g. ``[Errno 28] cannot write the part file
    {storage_root}/…/.part-00000.parquet.….inprogress: No space left on device``. The errno (and so the
    subclass: ``FileNotFoundError``, ``PermissionError``, …) is kept; the original is chained.
    """
    try:
        yield
    except OSError as exc:
        where = path if fs is None or path is None else location_url(fs, path)
        if where and str(where) in str(exc):
            raise
        if exc.errno is None:
            raise OSError(f"cannot {action} {where}: {exc}") from exc
        # OSError(errno, text) becomes the matching subclass (FileNotFoundError, PermissionError, ...)
        raise OSError(exc.errno, f"cannot {action} {where}: {exc.strerror or exc}") from exc


# --------------------------------------------------------------------------------------------------
# Storage
# --------------------------------------------------------------------------------------------------
def to_fs(location: Any) -> tuple[fsspec.AbstractFileSystem, str]:
    """Resolve a storage location to an fsspec file system and a path on it.

    :param location: a local path (``str`` or ``os.PathLike``), an fsspec URL (``file://``, ``memory://``,
        ``s3://…``), or a path object with ``.fs`` and ``.path`` (Airflow ``ObjectStoragePath``,
        ``upath.UPath``).
    :return: ``(fs, path)`` where ``path`` has no protocol and no trailing slash; on object stores
        (``s3://``, ``gs://``, …) a file system without a listings cache (``use_listings_cache=False``),
        so that every listing and existence check sees what other processes wrote.
    :raises TypeError: another type.
    """
    fs = getattr(location, "fs", None)
    path = getattr(location, "path", None)
    if isinstance(fs, fsspec.AbstractFileSystem) and isinstance(path, str):
        return fs, path.rstrip("/") or "/"
    if isinstance(location, os.PathLike):
        location = os.fspath(location)
    if not isinstance(location, str) or not location:
        raise TypeError(f"storage location must be a path, an fsspec URL or an ObjectStoragePath, got {location!r}")
    protocol = fsspec.core.split_protocol(location)[0]
    # Object stores: no listings cache. Other processes (fetch tasks, Spark) write the same folders,
    # and a cached listing would hide their objects (s3fs caches every listing per instance).
    options = {"use_listings_cache": False} if protocol in OBJECT_STORE_PROTOCOLS else {}
    fs, path = fsspec.core.url_to_fs(location, **options)
    return fs, path.rstrip("/") or "/"


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    return "file" in protocols or "local" in protocols


def atomic_rename_ok(fs: fsspec.AbstractFileSystem) -> bool:
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    return not any(p in OBJECT_STORE_PROTOCOLS for p in protocols)


def location_url(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """Render ``path`` on ``fs`` for humans and for :func:`to_fs`: a plain path locally, else a URL."""
    return path if is_local(fs) else fs.unstrip_protocol(path)


#: Storage calls run at once by :func:`map_io` (each waits on the network on an object store).
IO_THREADS = 8


def map_io(fn: Callable[[Any], Any], items: Sequence[Any], threads: int = IO_THREADS) -> list[Any]:
    """``[fn(item) for item in items]`` with up to ``threads`` calls at once, in order: for
    independent storage calls (one per file or folder) whose time is mostly waiting.

    :raises Exception: the first error in ``items`` order (after the calls under way have ended).
    """
    if threads <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(threads, len(items)), thread_name_prefix="plgd-io") as pool:
        return list(pool.map(fn, items))


def write_bytes_atomic(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one: a
    temporary name in the same folder and a rename where renames are atomic (local and POSIX-like
    file systems), one PUT on object stores (where a PUT is atomic and a rename is a copy).

    :raises OSError: the write failed; the message names ``path`` (:func:`io_error_with_path`).
    """
    with io_error_with_path(fs, path, "write"):
        parent = posixpath.dirname(path)
        if atomic_rename_ok(fs):  # a file system with folders (object stores have none to create)
            if parent:
                fs.makedirs(parent, exist_ok=True)
            tmp = join_path(parent, f".{posixpath.basename(path)}.{uuid.uuid4().hex}.inprogress")
            fs.pipe_file(tmp, data)
            fs.mv(tmp, path)
        else:
            fs.pipe_file(path, data)


def read_json_document(fs: fsspec.AbstractFileSystem, path: str, what: str,
                       version: int | tuple[int, ...]) -> dict[str, Any] | None:
    """Read a JSON object that carries a ``version`` field (a manifest, a ledger record); None when
    ``path`` does not exist.

    :param version: the version expected, or the versions accepted.
    :raises ValueError: not valid JSON, or another version (names ``what`` and the path).
    """
    where = location_url(fs, path)
    try:
        raw = fs.cat_file(path)
    except FileNotFoundError:
        return None
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{what} {where} is not valid JSON: {exc}") from None
    found = value.get("version") if isinstance(value, dict) else None
    accepted = version if isinstance(version, tuple) else (version,)
    if found not in accepted:
        raise ValueError(f"{what} {where} has version {found!r}, expected "
                         + " or ".join(str(v) for v in accepted))
    return value

def exists(url: str) -> bool:
    """True if the file or folder ``url`` exists."""
    fs, path = to_fs(url)
    return bool(fs.exists(path))


def read_text(url: str) -> str | None:
    """The UTF-8 text of the file ``url``; None if it does not exist."""
    fs, path = to_fs(url)
    try:
        with fs.open(path, "rb") as fh:
            return fh.read().decode("utf-8")
    except FileNotFoundError:
        return None


def read_json(url: str) -> Any | None:
    """The parsed JSON file ``url``; None if it does not exist.

    :raises ValueError: the file is not JSON (names the path).
    """
    text = read_text(url)
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{url} is not valid JSON: {exc}") from None


def write_text(url: str, text: str) -> None:
    """Write ``text`` (UTF-8) to ``url`` so that readers see the old or the whole new content
    (:func:`write_bytes_atomic`: temp name + rename locally, one PUT on
    object stores).

    :raises OSError: the write failed (names the path).
    """
    fs, path = to_fs(url)
    write_bytes_atomic(fs, path, text.encode("utf-8"))


def write_json(target: str, value: Any, *, fs: fsspec.AbstractFileSystem | None = None, indent: int = 2,
               default: Callable[[Any], Any] | None = None) -> None:
    """The one writer of our JSON files (staging manifests, ledger records, run summaries): ``value``
    as key-sorted JSON indented by ``indent`` with a trailing newline, written atomically
    (:func:`write_bytes_atomic`).

    :param target: the file's URL, or its path on ``fs`` when ``fs`` is given.
    :param indent: spaces per level (the ledger's records use 1, manifests and summaries 2).
    :param default: ``json.dumps``' ``default`` (e.g. ``str`` for summaries); None: a value that is
        not JSON raises ``TypeError``.
    :raises OSError: the write failed (names the path).
    """
    data = (json.dumps(value, indent=indent, sort_keys=True, default=default) + "\n").encode("utf-8")
    if fs is None:
        fs, target = to_fs(target)
    write_bytes_atomic(fs, target, data)


def remove(url: str) -> bool:
    """Delete the file or folder ``url`` (recursively) if it exists; return whether it did."""
    fs, path = to_fs(url)
    if not fs.exists(path):
        return False
    fs.rm(path, recursive=True)
    return True
