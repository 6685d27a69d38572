"""Build the ``--py-files`` zip that lets the Spark applications run where the provider is not installed.

The Spark applications (``airflow_provider_plgd/spark_apps/*.py`` when installed, the repository's
top-level ``spark_apps/`` in a checkout: :func:`spark_app_path`; thin scripts over the
:mod:`airflow_provider_plgd.spark` package) import the pure-Python parts of the provider on the
driver and on every executor. On a cluster (``spark://``, YARN, Kubernetes) those machines usually
do not have ``airflow-provider-plgd`` installed, so spark-submit ships them in one zip with
``--py-files``; Spark puts the zip on ``sys.path`` of the driver and of each Python worker.

Zip content: the ``airflow_provider_plgd`` package, whole (every file but ``__pycache__`` and
compiled files), under its package path, with the Spark applications under
``airflow_provider_plgd/spark_apps/`` as the wheel installs them (the same zip, byte for byte, from a
checkout and from an install). The executors import only the modules that need no
Airflow (``plgd/``, ``spark/``, ``jetstream/``, ``spark_apps/``, ``staging``, ``ledger``, ``run_summary``,
``exceptions``); the Airflow-side modules travel along unused. A package boundary instead of a
file list: a new module needs no entry here.

Not included: third-party libraries. The Python environment of the Spark nodes needs
``pyarrow``, ``fsspec``, ``protobuf``, ``python-snappy`` and ``cbor2`` (the ``[spark]`` extra's
runtime needs; see ``setup.cfg``), e.g. through a shared virtualenv/conda env
(``spark.pyspark.python``) or a container image.

Nothing here imports Airflow or Spark. The zip is deterministic (sorted entries, fixed timestamps),
so rebuilding it gives the same bytes, and it is replaced atomically.

Trust boundary (``docs/operations.md``, "Shipping the plgd code to executors"): in client mode the
Spark driver runs the zip's code inside the Airflow worker, with the worker's environment (its
connections, ``AIRFLOW_CONN_*``). So the ETL never reads the zip from the storage root, which other
machines (Spark workers) may write. :func:`build_private_py_files_zip` (the ``plan`` task) writes
it into a directory only the worker's user can write (:func:`private_py_files_dir`), under a
content-addressed name ``plgd_py_files-<sha256>.zip``; :func:`verified_py_files_zip` (each Spark
task, :class:`~airflow_provider_plgd.operators.spark_submit.PlgdSparkSubmitOperator`) checks the
file's SHA-256 against that name right before ``spark-submit`` and refuses a file that differs.

Example::

    from airflow_provider_plgd.spark_deps import build_py_files_zip
    zip_path = build_py_files_zip("/opt/airflow/plgd_py_files")   # -> ".../plgd_py_files.zip"
    # SparkSubmitOperator(..., py_files=zip_path)  or  spark-submit --py-files <zip_path> ...
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import stat
import tempfile
import zipfile
from pathlib import Path

from airflow_provider_plgd.exceptions import PyFilesIntegrityError

#: Name of the zip when :func:`build_py_files_zip` is given a directory.
ZIP_NAME = "plgd_py_files.zip"
_FIXED_TIME = (2020, 1, 1, 0, 0, 0)
_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = (".pyc", ".pyo")
#: Environment variable that overrides :func:`private_py_files_dir`.
PY_FILES_DIR_ENV = "PLGD_PY_FILES_DIR"
#: Content-addressed zip name: ``plgd_py_files-<sha256 of the zip, 64 lowercase hex>.zip``.
CONTENT_ADDRESSED_NAME = re.compile(r"^plgd_py_files-([0-9a-f]{64})\.zip$")


def provider_dir() -> Path:
    """The ``airflow_provider_plgd`` package folder."""
    return Path(__file__).resolve().parent


def spark_apps_dir() -> Path:
    """The folder of the Spark application scripts, the package ``airflow_provider_plgd.spark_apps``.

    Installed from the wheel: ``airflow_provider_plgd/spark_apps`` beside this module. In a source
    checkout (on ``PYTHONPATH``, or installed editable): the repository's top-level ``spark_apps/``,
    which ``setup.cfg`` (``package_dir``) installs as ``airflow_provider_plgd/spark_apps``.
    """
    installed = provider_dir() / "spark_apps"
    if (installed / "__init__.py").is_file():
        return installed
    return provider_dir().parent / "spark_apps"


def spark_app_path(name: str) -> str:
    """Return the path of a Spark application script, ``<spark_apps_dir()>/<name>.py``: the
    application file ``spark-submit`` runs.

    :param name: ``decode_events``, ``dedupe_events`` or ``rebuild_snapshots``.
    :raises FileNotFoundError: the application is not installed with the provider.
    """
    path = spark_apps_dir() / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"Spark application {name!r} not found at {path}")
    return str(path)


def _tree_files(folder: Path, prefix: str) -> dict[str, Path]:
    """``{prefix + relative path: file}`` of the files under ``folder`` (no caches, no compiled files)."""
    entries: dict[str, Path] = {}
    for source in folder.rglob("*"):
        rel = source.relative_to(folder)
        if not source.is_file() or _SKIP_DIRS.intersection(rel.parts) or source.suffix in _SKIP_SUFFIXES:
            continue
        entries[prefix + rel.as_posix()] = source
    return entries


def py_files_entries() -> list[tuple[str, Path]]:
    """List ``(name in zip, source file)`` for everything the zip holds, sorted by name: the
    ``airflow_provider_plgd`` package, whole, with the Spark applications under
    ``airflow_provider_plgd/spark_apps/`` (where the wheel installs them; in a source checkout they
    are read from :func:`spark_apps_dir`), so the zip is the same from a checkout and an install.
    """
    entries = _tree_files(provider_dir(), "airflow_provider_plgd/")
    entries.update(_tree_files(spark_apps_dir(), "airflow_provider_plgd/spark_apps/"))
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
    _write_atomic(path, data, mode=0o644)
    return str(path)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _local_root(storage_root: str) -> Path | None:
    """The local folder of a path or ``file://`` storage root; None for a remote URL."""
    root = storage_root.removeprefix("file://")
    return None if "://" in root else Path(root)


def private_py_files_dir() -> Path:
    """The worker-private folder for the ``--py-files`` zip; created with mode 0700 if missing.

    ``$PLGD_PY_FILES_DIR`` if set, else ``$AIRFLOW_HOME/plgd_py_files`` (``~/airflow`` when
    ``AIRFLOW_HOME`` is unset). An existing folder owned by this user with group/other
    permission bits is narrowed to 0700 (the zips in it are still hash-checked before use).

    :raises PyFilesIntegrityError: the path is not a directory, or it is owned by another user
        (someone else could replace the zip between the hash check and ``spark-submit``).
    """
    configured = os.environ.get(PY_FILES_DIR_ENV)
    if configured:
        path = Path(configured)
    else:
        home = os.environ.get("AIRFLOW_HOME") or str(Path.home() / "airflow")
        path = Path(home) / "plgd_py_files"
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):  # checked below, whoever made it
        path.mkdir(mode=0o700)
    info = os.stat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise PyFilesIntegrityError(f"--py-files folder {path} is not a directory")
    if info.st_uid != os.geteuid():
        raise PyFilesIntegrityError(
            f"--py-files folder {path} is owned by uid {info.st_uid}, not by this worker's uid "
            f"{os.geteuid()}; expected a folder only the Airflow worker's user can write "
            f"(set {PY_FILES_DIR_ENV} to one)"
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


def _write_atomic(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Write ``data`` to a temp file beside ``path`` with ``mode`` and rename it over ``path``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def build_private_py_files_zip(*, storage_root: str | None = None) -> str:
    """Build the zip into :func:`private_py_files_dir` under its content-addressed name.

    Used by the ETL ``plan`` task. The name ``plgd_py_files-<sha256>.zip`` carries the SHA-256 of
    the bytes, so each Spark task can check the file before ``spark-submit``
    (:func:`verified_py_files_zip`). An existing file of that name is kept only if its hash
    matches; otherwise it is replaced (atomic rename).

    :param storage_root: the run's storage root; a local root may not contain the private folder
        (the root is shared with other machines, e.g. the Spark workers).
    :return: the zip path (str).
    :raises PyFilesIntegrityError: the private folder is inside the local storage root or not
        private (:func:`private_py_files_dir`).
    :raises FileNotFoundError: a source file is missing.
    """
    folder = private_py_files_dir()
    local_root = _local_root(storage_root) if storage_root else None
    if local_root is not None and folder.resolve().is_relative_to(local_root.resolve()):
        raise PyFilesIntegrityError(
            f"--py-files folder {folder} is inside the storage root {storage_root!r}, which other "
            f"machines may write; set {PY_FILES_DIR_ENV} to a folder only the Airflow worker writes"
        )
    data = build_py_files_bytes()
    path = folder / f"plgd_py_files-{_sha256(data)}.zip"
    if not (path.is_file() and _sha256_file(path) == _sha256(data)):
        _write_atomic(path, data)
    return str(path)


def verified_py_files_zip(planned: str | os.PathLike[str]) -> str:
    """Return a local copy of the planned zip whose SHA-256 was checked just now.

    Called right before ``spark-submit`` (``PlgdSparkSubmitOperator.execute``). ``planned`` is the
    path ``plan`` returned; only its name (``plgd_py_files-<sha256>.zip``) is used: the file is
    looked up in *this* worker's :func:`private_py_files_dir` (``plan`` may have run on another
    host). If it is missing there, it is built from the provider installed on this worker, which
    must give the same hash.

    :param planned: the path from the ``plan`` task's XCom.
    :return: the verified local path (str), to pass as ``--py-files``.
    :raises PyFilesIntegrityError: the name is not content-addressed; the file's SHA-256 differs
        from its name (tampered or corrupt: the message names the path and both hashes); this
        worker's installed provider builds a zip with another hash (version skew between workers);
        the private folder is not private.
    """
    name = Path(os.fspath(planned)).name
    match = CONTENT_ADDRESSED_NAME.match(name)
    if match is None:
        raise PyFilesIntegrityError(
            f"--py-files {os.fspath(planned)!r} is not a content-addressed plgd zip; expected a name "
            "plgd_py_files-<sha256>.zip from spark_deps.build_private_py_files_zip"
        )
    expected = match.group(1)
    path = private_py_files_dir() / name
    if not path.exists():
        data = build_py_files_bytes()
        built = _sha256(data)
        if built != expected:
            raise PyFilesIntegrityError(
                f"--py-files {path} is missing on this worker and the provider installed here builds "
                f"a zip with sha256 {built}, but the plan step recorded sha256 {expected}: install the "
                "same airflow-provider-plgd version on every worker"
            )
        _write_atomic(path, data)
    actual = _sha256_file(path)
    if actual != expected:
        raise PyFilesIntegrityError(
            f"--py-files {path} has sha256 {actual} but the plan step recorded sha256 {expected}: the "
            "file was changed after it was built; refusing to run it (delete it to rebuild it)"
        )
    return str(path)
