"""Durable mode's local spool: rows kept on local disk until the batch's folder name is known.

A durable batch's folder is named after the first and last stream sequence it read
(``times.durable_interval_id``), known only at the end, and redelivered messages may come out of
order; so the rows go to local Arrow IPC files as they come and are read back sorted.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from typing import Any

from airflow_provider_plgd import staging, storage

#: File name prefix of durable-mode spool files (``plgd-durable-spool-{consumer}-f{filter}-{pid}-{random}.arrow``).
SPOOL_PREFIX = "plgd-durable-spool-"
#: Spool files older than this (seconds) are leftovers of killed runs: each durable run deletes
#: the ``plgd-durable-*.arrow`` files in its spool folder not modified for this long (a younger
#: one may belong to a live run of another consumer). Also removes the ``plgd-durable-*.arrow``
#: leftovers that earlier versions wrote to the system temp folder, when that is the spool folder.
STALE_SPOOL_S = 3600
#: Name of the default spool folder under ``{destination}/staging/{stream}/`` (local destinations).
SPOOL_DIR_NAME = "_spool"


def default_spool_dir(root: Any, stream: str) -> str:
    """The spool folder of durable mode when the operator's ``spool_dir`` is not set:
    ``{destination}/staging/{stream}/_spool`` for a local destination (the disk that receives the
    batch), else the system temp folder (``tempfile.gettempdir()``, i.e. ``$TMPDIR`` or ``/tmp``)."""
    import tempfile

    fs, path = storage.to_fs(root)
    if storage.is_local(fs):
        return os.path.join(staging.stream_path(path, stream), SPOOL_DIR_NAME)
    return tempfile.gettempdir()


def remove_stale_spools(spool_dir: str, log: Any, max_age_s: float = STALE_SPOOL_S) -> list[str]:
    """Delete ``plgd-durable-*.arrow`` files in ``spool_dir`` not modified for ``max_age_s`` seconds
    (leftovers of killed runs). :return: the deleted paths.
    :raises OSError: naming the path, when one cannot be deleted."""
    import glob

    removed = []
    now = time.time()
    for path in glob.glob(os.path.join(glob.escape(spool_dir), "plgd-durable-*.arrow")):
        try:
            if now - os.lstat(path).st_mtime < max_age_s:
                continue
            os.unlink(path)
        except FileNotFoundError:  # removed by another run meanwhile
            continue
        except OSError as exc:
            raise OSError(exc.errno, f"cannot delete the stale spool file {path}: {exc.strerror}") from exc
        removed.append(path)
    if removed:
        log.info("Removed %s spool file(s) of killed runs from %s: %s", len(removed), spool_dir, removed)
    return removed


class Spool:
    """Durable mode: rows of one filter spooled to a local Arrow IPC file until the folder name
    (the batch's sequence range) is known; read back sorted by stream sequence.

    Memory stays flat: rows go to disk as they come, and are read back through a memory map, a
    chunk at a time (the sort keeps only the row order in memory: 8 bytes per row). Redelivered
    messages may come out of stream order, hence the sort. Every I/O error names the file.
    """

    def __init__(self, spool_dir: str, consumer: str, filter_index: int) -> None:
        import uuid

        import pyarrow as pa

        self._pa = pa
        self.path = os.path.join(
            spool_dir, f"{SPOOL_PREFIX}{consumer}-f{filter_index}-{os.getpid()}-{uuid.uuid4().hex[:8]}.arrow")
        self._schema = pa.schema([("stream_seq", pa.int64()), ("subject", pa.string()), ("time_ns", pa.int64()),
                                  ("headers", pa.map_(pa.string(), pa.string())), ("data", pa.binary())])
        self._sink = self._writer = None
        with storage.io_error_with_path(None, self.path, "create the durable-mode spool file"):
            os.makedirs(spool_dir, exist_ok=True)
            self._sink = pa.OSFile(self.path, "wb")
            self._writer = pa.ipc.new_file(self._sink, self._schema)
        self.count = 0

    def write(self, rows: Sequence[tuple]) -> None:
        pa = self._pa
        seqs, subjects, times, headers, datas = zip(*rows)
        batch = pa.record_batch(
            [pa.array(seqs, pa.int64()), pa.array(subjects, pa.string()), pa.array(times, pa.int64()),
             pa.array([list(h.items()) if h else None for h in headers], self._schema.field("headers").type),
             pa.array(datas, pa.binary())], schema=self._schema)
        assert self._writer is not None, "write() after read()"
        with storage.io_error_with_path(None, self.path, "write the durable-mode spool file"):
            self._writer.write_batch(batch)
        self.count += len(rows)

    def read(self, chunk_rows: int):
        """Yield the rows (5-tuples) in stream-sequence order, ``chunk_rows`` at a time."""
        import pyarrow.compute as pc

        assert self._writer is not None and self._sink is not None, "read() twice"
        with storage.io_error_with_path(None, self.path, "read back the durable-mode spool file"):
            self._writer.close()
            self._sink.close()
            self._writer = self._sink = None
            with self._pa.memory_map(self.path) as source:
                table = self._pa.ipc.open_file(source).read_all()
                order = pc.sort_indices(table.column("stream_seq"))
                for start in range(0, len(order), chunk_rows):
                    chunk = table.take(order[start:start + chunk_rows])
                    cols = [chunk.column(0).to_pylist(), chunk.column(1).to_pylist(), chunk.column(2).to_pylist(),
                            [dict(h) if h is not None else None for h in chunk.column(3).to_pylist()],
                            chunk.column(4).to_pylist()]
                    yield list(zip(*cols))

    def close(self) -> None:
        """Close and delete the file (closing is best effort: this runs on error paths)."""
        for handle in (self._writer, self._sink):
            if handle is not None:
                with contextlib.suppress(Exception):
                    handle.close()
        self._writer = self._sink = None
        with contextlib.suppress(FileNotFoundError), \
                storage.io_error_with_path(None, self.path, "delete the durable-mode spool file"):
            os.unlink(self.path)
