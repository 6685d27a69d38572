"""The storage layout: every folder, table and file under the storage root, from one value.

A :class:`Layout` is built once from the storage root (:meth:`Layout.of`, which applies
:func:`~airflow_provider_plgd.tables.storage_root.normalize_storage_root`, the one spelling that fsspec
and delta-rs resolve alike) and then passed on; no other module joins a path to the root::

    {root}/staging/{stream}                          staging table (Delta)
    {root}/staging/_spool                            default spill folder of a local root
    {root}/_ledger/pipeline.json                     the pipeline's identity
    {root}/_ledger/{stream}/interval={interval_id}/  the interval ledger
    {root}/_runs/{app}/interval={interval_id}.json   the Spark applications' run summaries
    {root}/{events,quarantine,events_deduped,msgid_index}   interval tables (Delta)
    {root}/snapshots/{table}                         snapshot tables (Delta)

The plan's XCom carries it as ``{"storage_root": root}`` (:meth:`Layout.as_dict`); the Spark
applications get it as ``--root``.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from airflow_provider_plgd.tables.storage import join_path, location_url, to_fs
from airflow_provider_plgd.tables.storage_root import normalize_storage_root, resolve_storage_root
from airflow_provider_plgd.times import IntervalId

#: Folder of the staging tables (one per stream).
STAGING_DIR = "staging"
#: Folder of the interval ledger (one folder per stream) and of the pipeline's identity.
LEDGER_DIR = "_ledger"
#: Folder of the Spark applications' run summaries.
RUNS_DIR = "_runs"
#: Folder of the snapshot tables.
SNAPSHOTS_DIR = "snapshots"
#: Name of the default spill folder under ``{root}/staging/`` (local roots).
SPOOL_DIR_NAME = "_spool"
#: The pipeline's identity, under :data:`LEDGER_DIR`.
PIPELINE_FILE = "pipeline.json"

# Path separators, the partition key/value separator, parent references, glob characters.
_FORBIDDEN_IN_PARTITION = ("/", "\\", "=", "..", "*", "?", "[", "]")


def validate_partition_value(value: object, what: str) -> str:
    """Check that ``value`` is safe as one path segment under the storage root: a partition value
    (``interval_id=…``, ``event_type=…``), the ``{stream}`` folder, an owner ID in a file name.

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


def _root_text(value: Any) -> str:
    """A root as text: a path object with ``.fs`` and ``.path`` (``ObjectStoragePath``) as its URL."""
    if not isinstance(value, str) and hasattr(value, "fs") and hasattr(value, "path"):
        return location_url(*to_fs(value))
    return str(value)


@dataclass(frozen=True)
class Layout:
    """Where everything of a pipeline is, under one storage root.

    :param root: the storage root in :func:`~airflow_provider_plgd.tables.storage_root.normalize_storage_root`'s
        spelling (build it with :meth:`of`).
    """

    root: str

    @classmethod
    def of(cls, value: Any) -> Layout:
        """The layout of a storage root: a local path, an fsspec URL (``s3://bucket/prefix``), an
        ``os.PathLike`` or a path object with ``.fs`` and ``.path`` (Airflow ``ObjectStoragePath``),
        or a :class:`Layout` (returned as is).

        :raises ValueError: a root that ``normalize_storage_root`` refuses (the message names it).
        """
        if isinstance(value, Layout):
            return value
        return cls(normalize_storage_root(_root_text(value)))

    @classmethod
    def resolve(cls, value: str | None, connection_root: str | None) -> Layout:
        """The layout of the storage root that ``value`` or the defaults give
        (:func:`~airflow_provider_plgd.tables.storage_root.resolve_storage_root`: the value, else
        ``connection_root``, else ``$AIRFLOW_HOME/plgd``), normalised there once.

        :param connection_root: the connection's ``storage_root`` extra, looked up by the caller
            (``hooks.base.resolve_layout`` does both), or None.
        :raises ValueError: a root that is refused (the message names it).
        """
        return cls(resolve_storage_root(value, connection_root))

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> Layout:
        """From :meth:`as_dict`'s ``{"storage_root": …}`` (the plan's XCom), checked again.

        :raises ValueError: no ``storage_root`` key, or a root that is refused.
        """
        if not isinstance(value, Mapping) or not value.get("storage_root"):
            raise ValueError(f"expected a mapping with 'storage_root', got {value!r}")
        return cls.of(value["storage_root"])

    def as_dict(self) -> dict[str, str]:
        """``{"storage_root": root}`` (JSON, the plan's XCom)."""
        return {"storage_root": self.root}

    def __str__(self) -> str:
        return self.root


    # -- staging --------------------------------------------------------------------------------
    def staging_table(self, stream: str) -> str:
        """``{root}/staging/{stream}``. :raises ValueError: a stream not safe in a path."""
        return join_path(self.root, STAGING_DIR, validate_partition_value(stream, "stream"))

    def spool_dir(self) -> str | None:
        """``{root}/staging/_spool`` for a local root (the disk that receives the files), else None."""
        return None if "://" in self.root else join_path(self.root, STAGING_DIR, SPOOL_DIR_NAME)

    # -- ledger ---------------------------------------------------------------------------------
    def pipeline_file(self) -> str:
        """``{root}/_ledger/pipeline.json``: the pipeline's identity."""
        return join_path(self.root, LEDGER_DIR, PIPELINE_FILE)

    def ledger_stream_dir(self, stream: str) -> str:
        """``{root}/_ledger/{stream}``. :raises ValueError: a stream not safe in a path."""
        return join_path(self.root, LEDGER_DIR, validate_partition_value(stream, "stream"))

    def ledger_interval_dir(self, stream: str, interval_id: IntervalId | str) -> str:
        """``{root}/_ledger/{stream}/interval={interval_id}``.

        :raises ValueError: a stream or interval ID that is not safe in a path.
        """
        return join_path(self.ledger_stream_dir(stream),
                         f"interval={validate_partition_value(str(interval_id), 'interval_id')}")

    # -- run summaries --------------------------------------------------------------------------
    def runs_dir(self) -> str:
        """``{root}/_runs``."""
        return join_path(self.root, RUNS_DIR)

    def run_summary(self, app: str, interval_id: IntervalId | str) -> str:
        """``{root}/_runs/{app}/interval={interval_id}.json``.

        :raises ValueError: an app or interval ID that is not safe in a path.
        """
        return join_path(self.runs_dir(), validate_partition_value(app, "app"),
                         f"interval={validate_partition_value(str(interval_id), 'interval_id')}.json")

    # -- tables ---------------------------------------------------------------------------------
    def table(self, name: str) -> str:
        """``{root}/{name}``: an interval table (``events``, ``quarantine``, ``events_deduped``,
        ``msgid_index``; the names are checked by ``delta_tables.interval_table_uri``)."""
        return join_path(self.root, validate_partition_value(name, "table"))

    def snapshots_dir(self) -> str:
        """``{root}/snapshots``."""
        return join_path(self.root, SNAPSHOTS_DIR)

    def snapshot_table(self, table: str) -> str:
        """``{root}/snapshots/{table}``."""
        return join_path(self.snapshots_dir(), validate_partition_value(table, "snapshot table"))


#: What the public entry points take as a storage root (each turns it into a :class:`Layout` once,
#: with :meth:`Layout.of`): a local path, an fsspec URL, an ``os.PathLike`` (``ObjectStoragePath``)
#: or a :class:`Layout`. Everything below them takes the :class:`Layout`.
StorageRoot: TypeAlias = "str | os.PathLike[str] | Layout"
