"""The pipeline's identity: the settings that decide what the tables mean, fixed by the DAG author
and recorded with the tables.

The tables of a storage root are one chain (dedupe drops what earlier intervals kept, each snapshot
is the one before plus an interval), so every run that writes them must use the same:

* ``storage_root``: where the tables are (:func:`storage_root.normalize_storage_root`'s spelling);
* ``stream``: the JetStream stream read;
* ``owners`` (``None``: every owner) and ``event_types``: the selection;
* ``lookback_intervals``: dedupe's lookback;
* ``max_content_bytes``: decode's limit of one event's decoded size (bytes).

The first ``plan`` on a root records them in ``{root}/_ledger/pipeline.json`` (:data:`IDENTITY_FILE`),
in one create-if-absent (:func:`create_exclusive`: of two first plans at once exactly one records);
every later ``plan``, and each Spark application before it reads anything, compares its own
settings with the record (:func:`check_recorded`) and is refused with
:class:`~airflow_provider_plgd.exceptions.PipelineIdentityError`, which names each setting, the
recorded value and the run's. Each Delta commit carries the identity in its ``plgd`` metadata
too (:meth:`PipelineIdentity.as_dict`, key ``pipeline``). docs/reliability.md, "One pipeline identity".
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_plgd.exceptions import PipelineIdentityError
from airflow_provider_plgd.plgd.event_types import EVENT_TYPES
from airflow_provider_plgd.tables import storage
from airflow_provider_plgd.tables.layout import LEDGER_DIR, PIPELINE_FILE, Layout

#: The identity's file, below the storage root.
IDENTITY_FILE = f"{LEDGER_DIR}/{PIPELINE_FILE}"
#: Version of :data:`IDENTITY_FILE`'s format.
IDENTITY_VERSION = 1
#: The settings of the identity, in the order errors name them.
SETTINGS = ("storage_root", "stream", "owners", "event_types", "lookback_intervals", "max_content_bytes")


@dataclass(frozen=True)
class PipelineIdentity:
    """What the tables of one storage root mean (the module's list).

    :ivar owners: sorted owner IDs, or None for every owner.
    :ivar event_types: sorted event types.
    """

    storage_root: str
    stream: str
    owners: tuple[str, ...] | None
    event_types: tuple[str, ...]
    lookback_intervals: int
    max_content_bytes: int

    @classmethod
    def of(cls, *, storage_root: str, stream: str, owners: Sequence[str] | None, event_types: Sequence[str],
           lookback_intervals: int, max_content_bytes: int) -> PipelineIdentity:
        """The identity of checked values (owners and event types are sorted; ``[]`` owners is None)."""
        return cls(storage_root=storage_root, stream=stream,
                   owners=tuple(sorted(set(owners))) if owners else None,
                   event_types=tuple(sorted(set(event_types))), lookback_intervals=int(lookback_intervals),
                   max_content_bytes=int(max_content_bytes))

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> PipelineIdentity:
        """Read :meth:`as_dict`'s form."""
        return cls.of(storage_root=value["storage_root"], stream=value["stream"], owners=value.get("owners"),
                      event_types=value["event_types"], lookback_intervals=value["lookback_intervals"],
                      max_content_bytes=value["max_content_bytes"])

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (also in each Delta commit's ``plgd`` metadata, key ``pipeline``)."""
        return {"storage_root": self.storage_root, "stream": self.stream,
                "owners": None if self.owners is None else list(self.owners), "event_types": list(self.event_types),
                "lookback_intervals": self.lookback_intervals, "max_content_bytes": self.max_content_bytes}


def differences(recorded: Mapping[str, Any], run: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``[(setting, recorded value, run's value)]`` for each setting of ``run`` that ``recorded`` holds
    with another value (settings only one side has are not compared)."""
    found = []
    for name in SETTINGS:
        if name in recorded and name in run and _canonical(name, recorded[name]) != _canonical(name, run[name]):
            found.append((name, recorded[name], run[name]))
    return found


def _canonical(name: str, value: Any) -> Any:
    if name in ("owners", "event_types"):
        return tuple(sorted(set(value))) if value else None
    if name in ("lookback_intervals", "max_content_bytes"):
        return int(value)
    return value


def show(name: str, value: Any) -> str:
    """A setting's value as errors and logs name it: ``all owners``, ``all event types``, a list
    cut after 10 names, else ``repr``."""
    if name == "owners" and not value:
        return "all owners"
    if name == "event_types" and set(value or ()) >= set(EVENT_TYPES):
        return "all event types"
    if isinstance(value, (list, tuple)) and len(value) > 10:
        return repr(sorted(value)[:10])[:-1] + f", ... ({len(value)} in all)]"
    return repr(sorted(value) if isinstance(value, (list, tuple)) else value)


def identity_error(found: Sequence[tuple[str, Any, Any]], *, where: str, what: str) -> PipelineIdentityError:
    """The error of :func:`differences`' answer: one line per setting, with both values (:func:`show`)."""
    lines = [f"  {name}: {where} {show(name, recorded)}, this run {show(name, run)}" for name, recorded, run in found]
    return PipelineIdentityError(
        f"this run's settings differ from the pipeline's identity ({where}):\n" + "\n".join(lines) + "\n"
        f"{what} Nothing was read or written. These settings decide what the tables mean (docs/reliability.md, "
        "\"One pipeline identity\"): write with other settings to another storage root.",
        differences=list(found))


def recorded(layout: Layout) -> dict[str, Any] | None:
    """The identity recorded at ``root`` (:data:`IDENTITY_FILE`), or None.

    :raises ValueError: the file is not an identity of a known version (names the path).
    """
    fs, path = storage.to_fs(layout.pipeline_file())
    return storage.read_json_document(fs, path, "pipeline identity", (IDENTITY_VERSION,))


def check_recorded(layout: Layout, run: Mapping[str, Any]) -> dict[str, Any] | None:
    """Compare the settings of ``run`` (a subset of :data:`SETTINGS`) with the identity recorded at ``root``.

    :return: the recorded identity, or None when none is recorded (a root no ``plan`` wrote).
    :raises PipelineIdentityError: a setting differs (each named with both values).
    """
    found = recorded(layout)
    if found is not None:
        diff = differences(found, run)
        if diff:
            raise identity_error(diff, where=f"recorded in {layout.pipeline_file()}",
                                 what="The tables were written with the recorded settings.")
    return found


def record(layout: Layout, identity: PipelineIdentity) -> dict[str, Any]:
    """:func:`record_first`'s recorded identity.

    :raises PipelineIdentityError: as :func:`check_recorded`, also for the loser of a race.
    """
    return record_first(layout, identity)[0]


def record_first(layout: Layout, identity: PipelineIdentity) -> tuple[dict[str, Any], bool]:
    """Check ``identity`` against the one recorded at ``layout``'s root (:func:`check_recorded`) and
    record it there when none is, in one create-if-absent (:func:`create_exclusive`): of two first
    ``plan`` runs at once, exactly one records its identity; the other then reads it and is refused
    when its settings differ (or goes on when they are the same).

    :return: ``(the recorded identity, whether this call recorded it)``.
    :raises PipelineIdentityError: as :func:`check_recorded`, also for the loser of a race.
    :raises OSError: the write failed (names the path).
    """
    found = check_recorded(layout, identity.as_dict())
    if found is not None:
        return found, False
    value = {"version": IDENTITY_VERSION, **identity.as_dict()}
    data = (json.dumps(value, indent=1, sort_keys=True) + "\n").encode("utf-8")
    try:
        create_exclusive(layout.pipeline_file(), data)
    except FileExistsError:  # another first plan recorded first: its identity binds this run
        found = check_recorded(layout, identity.as_dict())
        if found is None:  # pragma: no cover - removed again in between
            raise
        return found, False
    return value, True


def forget(layout: Layout) -> None:
    """Remove the identity that :func:`record_first` has just recorded (``plan`` refuses the root after
    all: nothing else was written there)."""
    storage.remove(layout.pipeline_file())


def create_exclusive(url: str, data: bytes) -> None:
    """Create the file ``url`` with ``data`` only if no file is there, atomically: readers see no
    file or the whole one, and of two writers at once exactly one succeeds.

    * local: the data goes to a temporary file, which is then hard-linked to ``url``
      (``link`` fails when the name exists);
    * S3 (``s3://``): one PUT with ``If-None-Match: *`` (S3 conditional writes; moto too);
    * another store: fsspec's ``pipe_file(mode="create")`` (atomic where the store implements it).

    :raises FileExistsError: ``url`` exists (or another writer created it first).
    :raises OSError: the write failed (names the path).
    """
    fs, path = storage.to_fs(url)
    with storage.io_error_with_path(fs, path, "create"):
        if storage.is_local(fs):
            fs.makedirs(posixpath.dirname(path), exist_ok=True)
            tmp = f"{posixpath.dirname(path)}/.{posixpath.basename(path)}.{uuid.uuid4().hex}.inprogress"
            fs.pipe_file(tmp, data)
            try:
                os.link(tmp, path)
            finally:
                os.unlink(tmp)
            return
        for attempt in range(5):
            try:
                fs.pipe_file(path, data, mode="create")
                return
            except OSError as err:
                code = ((getattr(err.__cause__, "response", None) or {}).get("Error") or {}).get("Code")
                if isinstance(err, FileExistsError) or code == "PreconditionFailed":  # 412: the key exists
                    raise FileExistsError(errno.EEXIST, f"{url} exists") from err
                # 409 ConditionalRequestConflict: another conditional PUT of the key is under way
                if code != "ConditionalRequestConflict" or attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))


def check_app(layout: Layout, **settings: Any) -> dict[str, Any] | None:
    """A Spark application's check, first thing: its root and ``settings`` (of :data:`SETTINGS`)
    against the identity recorded at the root (:func:`check_recorded`). A root that no ``plan``
    wrote (an application run by hand) records nothing and passes.

    :return: the recorded identity (the application puts it into its commits' metadata), or None.
    :raises PipelineIdentityError: a setting differs from the recorded one.
    """
    return check_recorded(layout, {"storage_root": layout.root, **settings})
