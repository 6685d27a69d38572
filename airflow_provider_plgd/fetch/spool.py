"""The local spill folder: where a fetch puts sorted runs of rows it cannot keep in memory.

A fetch task keeps its messages in memory up to ``range_buffer_bytes`` of payload (the rows of a
staging file are ordered by owner, so they are written at the end); past that they are spilled
to local Arrow IPC files (:class:`~airflow_provider_plgd.fetch.stager.Stager`). This module names
the folder and removes the files of killed runs.
"""

from __future__ import annotations

import glob
import os
import tempfile
import time
from typing import Any

from airflow_provider_plgd.tables.layout import SPOOL_DIR_NAME, Layout  # noqa: F401 (SPOOL_DIR_NAME re-exported)

#: Spill files older than this (seconds) are leftovers of killed runs: each fetch that spills
#: deletes the ``plgd-stage-*.arrow`` (and earlier versions' ``plgd-durable-*.arrow``) files in its
#: spill folder not modified for this long (a younger one may belong to a live run).
STALE_SPOOL_S = 3600
#: Patterns of the spill files of this and earlier versions.
SPOOL_PATTERNS = ("plgd-stage-*.arrow", "plgd-durable-*.arrow")


def default_spool_dir(layout: Layout) -> str:
    """The spill folder when the operator's ``spool_dir`` is not set: ``{root}/staging/_spool``
    for a local storage root (the disk that receives the files; beside, not inside, the staging
    tables), else the system temp folder (``tempfile.gettempdir()``, i.e. ``$TMPDIR`` or ``/tmp``)."""
    return layout.spool_dir() or tempfile.gettempdir()


def remove_stale_spools(spool_dir: str, log: Any, max_age_s: float = STALE_SPOOL_S) -> list[str]:
    """Delete spill files (:data:`SPOOL_PATTERNS`) in ``spool_dir`` not modified for ``max_age_s``
    seconds (leftovers of killed runs). :return: the deleted paths.
    :raises OSError: naming the path, when one cannot be deleted."""
    removed = []
    now = time.time()
    for pattern in SPOOL_PATTERNS:
        for path in glob.glob(os.path.join(glob.escape(spool_dir), pattern)):
            try:
                if now - os.lstat(path).st_mtime < max_age_s:
                    continue
                os.unlink(path)
            except FileNotFoundError:  # removed by another run meanwhile
                continue
            except OSError as exc:
                raise OSError(exc.errno, f"cannot delete the stale spill file {path}: {exc.strerror}") from exc
            removed.append(path)
    if removed:
        log.info("Removed %s spill file(s) of killed runs from %s: %s", len(removed), spool_dir, removed)
    return removed
