"""Storage roots that cannot overlap: a run's root is refused when it lies inside, or holds, another
pipeline's root or a table folder.

A root below an allowed one may be chosen by a run (``run_params.check_run_storage_root``), so a user
who may only trigger a DAG could pick ``{root}/events/x`` under the DAG's own root, or a folder that
holds another pipeline's root. That run's ledger, staging and tables would then sit inside the other
pipeline's folders (or the other way round): a table's vacuum deletes files no commit names, a
listing sees foreign folders. Two checks keep roots apart, both before anything is written:

* :func:`check_apart_of` (no I/O): the run's root is not strictly inside, nor strictly above, a
  root the DAG writes by its own settings (its default root, the connection's ``storage_root``);
  ``run_params.check_run`` applies it in ``wait_for_interval`` and ``plan``.
* :func:`check_apart` (reads only, in ``plan`` before the first write, and again right after the
  identity is recorded): what the storage holds. Our roots and tables are recognised by their
  records, never by a folder name a user can create: a pipeline's root by its identity
  ``{root}/_ledger/pipeline.json``, a Delta table by its ``_delta_log``.

  - up: no proper ancestor of the root is a pipeline's root or a Delta table (two probes per
    ancestor; local roots also along the path with symbolic links resolved);
  - the root itself is no Delta table;
  - down: the root's own folders hold nothing foreign. Below a folder of the layout (``staging``,
    ``snapshots``, ``_ledger``, ``_runs``, an interval table without a Delta log) no folder is a
    pipeline's root or (where the layout has no table) a Delta table; any other folder of the root
    is no pipeline's root, nor (while the root has no identity of its own) a Delta table. The root
    is listed, and each of its layout folders that is not a table; Delta
    tables are never listed, so the cost does not grow with the data.

Paths are compared in :func:`~.storage_root.normalize_storage_root`'s spelling (no percent escape,
no dot segment, one slash, lowercase scheme and bucket), the spelling fsspec and delta-rs are given.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable

from airflow_provider_plgd.exceptions import StorageRootOverlapError
from airflow_provider_plgd.tables import storage
from airflow_provider_plgd.tables.delta_tables import INTERVAL_TABLES
from airflow_provider_plgd.tables.layout import (
    LEDGER_DIR,
    PIPELINE_FILE,
    RUNS_DIR,
    SNAPSHOTS_DIR,
    STAGING_DIR,
    Layout,
)
from airflow_provider_plgd.tables.storage_root import same_or_below

__all__ = ["MAX_ENTRIES", "ancestors", "check_apart", "check_apart_of"]

#: The Delta log folder that makes a folder a table.
DELTA_LOG = "_delta_log"
#: Entries of one folder that :func:`check_apart` looks at; a root (or a layout folder) with more is
#: refused: it is not a folder of its own.
MAX_ENTRIES = 256

_HOW = ("Nothing was written. A storage root must be a folder of its own, apart from every other root "
        "and table (docs/operations.md, \"Storage roots\").")


def ancestors(location: str) -> list[str]:
    """The proper ancestors of the root ``location`` (normalised spelling), nearest first, down to the bucket of a
    URL or the first folder of a local path: ``/a/b/c`` -> ``["/a/b", "/a"]``,
    ``s3://lake/x/y`` -> ``["s3://lake/x", "s3://lake"]``."""
    scheme, sep, rest = location.partition("://")
    prefix, path = (f"{scheme}://", rest) if sep else ("/", location.lstrip("/"))
    segments = path.split("/")
    return [prefix + "/".join(segments[:n]) for n in range(len(segments) - 1, 0, -1)]


def check_apart_of(location: str, others: Iterable[str]) -> None:
    """Refuse the root ``location`` when it lies strictly inside, or strictly above, one of ``others`` (all in
    :func:`~.storage_root.normalize_storage_root`'s spelling). No I/O.

    :raises StorageRootOverlapError: names both roots.
    """
    for other in others:
        if not other or other == location:
            continue
        if same_or_below(location, other):
            raise _overlap(location, other, f"it lies inside {other!r}, a root this DAG writes")
        if same_or_below(other, location):
            raise _overlap(location, other, f"it holds {other!r}, a root this DAG writes")


def check_apart(layout: Layout, others: Iterable[str] = ()) -> None:
    """Refuse the root of ``layout`` when it overlaps another root or a table (the module's rules):
    :func:`check_apart_of` with ``others``, then what the storage holds. Reads only.

    :param others: roots the DAG writes by its own settings (normalised spelling).
    :raises StorageRootOverlapError: names the run's root and what it overlaps.
    """
    top = layout.root
    check_apart_of(top, others)
    fs, _ = storage.to_fs(top)
    local = storage.is_local(fs)
    chains = [ancestors(top)]
    if local:  # a symbolic link on the way may lead into another root
        real = os.path.realpath(top)
        if real != top:  # (the root itself there is the same folder: its own records are its own)
            check_apart_of(real, [os.path.realpath(o) for o in others if o and "://" not in o])
            chains.append(ancestors(real))
    probes = [(a, storage.join_path(a, LEDGER_DIR, PIPELINE_FILE), "a pipeline's root") for c in chains for a in c]
    probes += [(a, storage.join_path(a, DELTA_LOG), "a Delta table") for c in chains for a in c]
    probes.append((top, storage.join_path(top, DELTA_LOG), "a Delta table"))
    _refuse_found(fs, top, probes, inside=True)
    _check_below(fs, top)


def _check_below(fs, top: str) -> None:
    """The down rule of the module: the root's own folders hold no foreign root or table."""
    children = _folders(fs, top)
    recorded = bool(children) and bool(fs.exists(storage.to_fs(storage.join_path(top, LEDGER_DIR, PIPELINE_FILE))[1]))
    probes: list[tuple[str, str, str]] = []
    listed: list[tuple[str, bool]] = []  # (layout folder to list, whether a table there is ours)
    tables = [c for c in children if posixpath.basename(c) in INTERVAL_TABLES]
    own_tables = _exist(fs, [storage.join_path(c, DELTA_LOG) for c in tables])
    for child in children:
        name = posixpath.basename(child)
        if name in INTERVAL_TABLES:
            if not own_tables[tables.index(child)]:
                listed.append((child, False))  # no Delta log: a folder someone made
        elif name in (STAGING_DIR, SNAPSHOTS_DIR):
            listed.append((child, True))
        elif name in (LEDGER_DIR, RUNS_DIR):
            listed.append((child, False))
        else:
            probes.append((child, storage.join_path(child, LEDGER_DIR, PIPELINE_FILE), "a pipeline's root"))
            if not recorded:  # a recorded root's tables are its own (its first plan recorded it before any)
                probes.append((child, storage.join_path(child, DELTA_LOG), "a Delta table"))
    for folder, tables_ours in listed:
        for inner in _folders(fs, folder):
            probes.append((inner, storage.join_path(inner, LEDGER_DIR, PIPELINE_FILE), "a pipeline's root"))
            if not tables_ours:
                probes.append((inner, storage.join_path(inner, DELTA_LOG), "a Delta table"))
    _refuse_found(fs, top, probes, inside=False)


def _folders(fs, url: str) -> list[str]:
    """The folders directly below ``url`` as URLs (``[]`` when it does not exist), at most :data:`MAX_ENTRIES`.

    :raises StorageRootOverlapError: more entries than that.
    """
    path = storage.to_fs(url)[1]
    try:
        entries = fs.ls(path, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return []
    if len(entries) > MAX_ENTRIES:
        raise StorageRootOverlapError(
            f"the storage root folder {url!r} holds more than {MAX_ENTRIES} entries; it is not a folder of its own. "
            + _HOW, run_root=url, found=url)
    base = url.rstrip("/")
    names = [str(e["name"]).rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory"]
    return [f"{base}/{n}" for n in sorted(set(names)) if n]


def _exist(fs, urls: list[str]) -> list[bool]:
    return storage.map_io(lambda url: bool(fs.exists(storage.to_fs(url)[1])), urls)


def _refuse_found(fs, top: str, probes: list[tuple[str, str, str]], *, inside: bool) -> None:
    found = _exist(fs, [p for _, p, _ in probes])
    for (where, probe, what), hit in zip(probes, found, strict=True):
        if hit:
            if inside and where == top:
                reason = f"it is {what} ({probe} exists)"
            elif inside:
                reason = f"it lies inside {where!r}, {what} ({probe} exists)"
            else:
                reason = f"it holds {where!r}, {what} ({probe} exists)"
            raise _overlap(top, where, reason)


def _overlap(top: str, found: str, reason: str) -> StorageRootOverlapError:
    return StorageRootOverlapError(f"the storage root {top!r} overlaps another one: {reason}. {_HOW}",
                                   run_root=top, found=found)
