"""airflow_provider_plgd.spark.folders on the local file system: the folder commit rule.

The same rule on a real S3 API: tests/integration/test_spark_apps_s3.py.
"""

from __future__ import annotations

import json
import os
import time

import pyarrow as pa
import pytest

from airflow_provider_plgd import storage
from airflow_provider_plgd.spark import folders


def write(folder, rel, rows, mtime=None):
    fs, path = storage.to_fs(str(folder))
    folders.write_parquet_file(fs, f"{path}/{rel}", pa.table({"a": list(range(rows))}))
    if mtime is not None:
        os.utime(folder / rel, (mtime, mtime))


def test_commit_names_the_files_and_removes_older_unnamed_ones(tmp_path):
    folder = tmp_path / "events" / "interval=X"
    old = time.time() - 100
    write(folder, "owner_id=o/part-00000-aaaaaa.parquet", 2, mtime=old)  # an earlier run's file
    write(folder, "part-00001-killed.parquet", 1, mtime=old)              # a killed run's file
    assert folders.read_manifest(str(folder)) is None
    with pytest.raises(FileNotFoundError, match="not committed"):
        folders.folder_files(str(folder))
    assert folders.committed_intervals(str(tmp_path / "events")) == []

    started = time.time() - 1
    write(folder, "owner_id=o/part-00000-bbbbbb.parquet", 3)
    write(folder, "part-00009-concurrent.parquet", 1, mtime=time.time() + 5)  # younger than the run: kept
    manifest = folders.commit_folder(str(folder), [{"path": "owner_id=o/part-00000-bbbbbb.parquet", "rows": 3}],
                                     table="events", interval_id="X", write_id="bbbbbb", started=started)
    assert manifest["rows"] == 3 and manifest["files"][0]["bytes"] > 0 and manifest["write_id"] == "bbbbbb"
    assert json.loads((folder / "_manifest.json").read_text()) == manifest
    assert (folder / "_SUCCESS").exists()
    left = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.parquet"))
    assert left == ["owner_id=o/part-00000-bbbbbb.parquet", "part-00009-concurrent.parquet"]
    assert folders.folder_files(str(folder)) == [("owner_id=o/part-00000-bbbbbb.parquet", -1, 3)]
    assert folders.committed_intervals(str(tmp_path / "events")) == ["X"]


def test_commit_fails_when_another_run_removed_its_files(tmp_path):
    folder = tmp_path / "q" / "interval=Y"
    with pytest.raises(OSError, match="another run of interval Y committed meanwhile"):
        folders.commit_folder(str(folder), [{"path": "part-00000-gone.parquet", "rows": 1}], table="quarantine",
                              interval_id="Y", write_id="gone", started=time.time())
    assert folders.read_manifest(str(folder)) is None  # nothing committed


def test_text_helpers(tmp_path):
    path = str(tmp_path / "a" / "b.json")
    assert storage.read_text(path) is None and storage.read_json(path) is None and not storage.exists(path)
    storage.write_text(path, '{"x": 1}')
    assert storage.read_json(path) == {"x": 1} and storage.exists(path)
    storage.write_text(path, "not json")
    with pytest.raises(ValueError, match="b.json is not valid JSON"):
        storage.read_json(path)
    assert storage.remove(str(tmp_path / "a")) and not storage.remove(str(tmp_path / "a"))
    assert folders.data_file_name(7, "w1") == "part-00007-w1.parquet"
    assert storage.join_path("s3://b/root/", "events", "interval=X") == "s3://b/root/events/interval=X"
