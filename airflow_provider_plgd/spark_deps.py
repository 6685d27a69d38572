"""Build the ``--py-files`` zip that lets the Spark applications run where the provider is not installed.

The Spark apps (``spark_apps/*.py``) import the pure-Python parts of the provider on the driver and
on every executor. On a cluster (``spark://``, YARN, Kubernetes) those machines usually do not have
``airflow-provider-plgd`` installed, so spark-submit ships them in one zip with ``--py-files``;
Spark puts the zip on ``sys.path`` of the driver and of each Python worker.

Zip content (paths inside the zip are package paths, so ``import airflow_provider_plgd.plgd`` works):

* ``airflow_provider_plgd/__init__.py`` (version only, no Airflow import)
* ``airflow_provider_plgd/plgd/**`` (subjects, IDs, event types, codec, content, msgid, generated
  ``pb/*_pb2.py`` and the ``.proto`` files)
* ``airflow_provider_plgd/staging.py`` (the staging contract, read by the decode app)
* ``airflow_provider_plgd/run_summary.py`` (the one home of the run-summary path rule)
* ``airflow_provider_plgd/ledger.py`` and ``exceptions.py`` (the interval ledger, read by the decode app)
* ``spark_apps/*.py``

Not included: third-party libraries. The Python environment of the Spark nodes needs
``pyarrow``, ``fsspec``, ``protobuf``, ``python-snappy`` and ``cbor2`` (the ``[spark]`` extra's
runtime needs; see ``setup.cfg``), e.g. through a shared virtualenv/conda env
(``spark.pyspark.python``) or a container image.

Nothing here imports Airflow or Spark. The zip is deterministic (sorted entries, fixed timestamps),
so rebuilding it gives the same bytes, and it is replaced atomically.

Example::

    from airflow_provider_plgd.spark_deps import build_py_files_zip
    zip_path = build_py_files_zip("/opt/airflow/plgd_py_files")   # -> ".../plgd_py_files.zip"
    # SparkSubmitOperator(..., py_files=zip_path)  or  spark-submit --py-files <zip_path> ...
"""

from __future__ import annotations

import io
import os
import tempfile
import zipfile
from pathlib import Path

#: Name of the zip when :func:`build_py_files_zip` is given a directory.
ZIP_NAME = "plgd_py_files.zip"
#: Provider files shipped besides ``plgd/**`` (relative to the package folder).
PROVIDER_FILES = ("__init__.py", "exceptions.py", "ledger.py", "staging.py", "run_summary.py")
_FIXED_TIME = (2020, 1, 1, 0, 0, 0)
_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = (".pyc", ".pyo")


def provider_dir() -> Path:
    """The ``airflow_provider_plgd`` package folder."""
    return Path(__file__).resolve().parent


def spark_apps_dir() -> Path:
    """The ``spark_apps`` folder: the installed package if importable, else the source checkout's.

    :raises FileNotFoundError: neither exists.
    """
    try:
        import spark_apps  # installed with the provider (setup.cfg packages include spark_apps)

        path = Path(spark_apps.__file__).resolve().parent
        if path.is_dir():
            return path
    except ImportError:
        pass
    path = provider_dir().parent / "spark_apps"
    if not path.is_dir():
        raise FileNotFoundError(f"spark_apps not found (not importable and not at {path})")
    return path


def py_files_entries() -> list[tuple[str, Path]]:
    """List ``(name in zip, source file)`` for everything the zip holds, sorted by name.

    :raises FileNotFoundError: a required file is missing.
    """
    pkg = provider_dir()
    entries: dict[str, Path] = {}
    for name in PROVIDER_FILES:
        source = pkg / name
        if not source.is_file():
            raise FileNotFoundError(f"required provider file {source} is missing")
        entries[f"airflow_provider_plgd/{name}"] = source
    plgd = pkg / "plgd"
    for source in plgd.rglob("*"):
        rel = source.relative_to(pkg)
        if not source.is_file() or _SKIP_DIRS.intersection(rel.parts) or source.suffix in _SKIP_SUFFIXES:
            continue
        entries["airflow_provider_plgd/" + rel.as_posix()] = source
    for source in spark_apps_dir().glob("*.py"):
        entries[f"spark_apps/{source.name}"] = source
    return sorted(entries.items())


def build_py_files_bytes() -> bytes:
    """Return the zip (deflated, deterministic) as bytes."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, source in py_files_entries():
            info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, source.read_bytes())
    return buf.getvalue()


def build_py_files_zip(target: str | os.PathLike[str]) -> str:
    """Write the ``--py-files`` zip and return its path.

    :param target: a ``.zip`` file path, or a directory (created if needed) that gets
        :data:`ZIP_NAME`.
    :return: the zip path as a string (give it to ``spark-submit --py-files`` or
        ``SparkSubmitOperator(py_files=...)``).
    :raises FileNotFoundError: a source file is missing.
    :raises OSError: the target cannot be written.

    The file is only rewritten when its content changes; it is written to a temp file in the
    same folder and renamed (atomic), so concurrent tasks never see a partial zip.
    """
    path = Path(target)
    if path.suffix != ".zip":
        path = path / ZIP_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    data = build_py_files_bytes()
    if path.is_file() and path.read_bytes() == data:
        return str(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return str(path)
