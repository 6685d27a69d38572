"""Import PySpark from the installed package instead of ``$SPARK_HOME/python/lib/pyspark.zip``.

``spark-submit`` puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on the ``PYTHONPATH`` of the
driver and of the Python daemon that forks the workers. Python compiles every module it imports
from a zip file again in each process (``zipimport`` reads ``.pyc`` files only from the zip
itself, and that zip ships none). With a pip-installed PySpark, ``SPARK_HOME`` is the installed
package, and its ``.py`` files next to their cached ``.pyc`` are the same sources, so importing
``pyspark.daemon``, ``pyspark.worker`` and ``pyspark.sql`` from it is several times faster than
from the zip. The daemon's share shows up as ``boot`` in PySpark's task timing log of every
application's first Python task (figures: docs/performance.md, "Measurements behind design
choices", M4).

:func:`prefer_installed_pyspark` moves the zip to the end of ``sys.path`` when the installed
package has the zip's exact version (``pyspark/version.py``); the zip stays as a fallback for
modules that only it has. ``python -m airflow_provider_plgd.spark.pyspark_daemon`` is PySpark's daemon after that
switch (Spark setting ``spark.python.daemon.module``); use it only where ``spark_apps`` is
installed next to PySpark (local mode, or executors with the provider installed).

Sources: PySpark's ``daemon.py`` (``manager()``; the worker module is imported after the fork)
and ``PythonWorkerFactory`` (``spark.python.daemon.module``), Python's ``zipimport`` docs.
"""

from __future__ import annotations

import importlib.machinery
import os
import re
import sys
import zipfile

_VERSION = re.compile(r"""__version__\s*(?::\s*str\s*)?=\s*['"]([^'"]+)['"]""")


def _version(text: str) -> str | None:
    match = _VERSION.search(text)
    return match.group(1) if match else None


def prefer_installed_pyspark(path: list[str] | None = None) -> bool:
    """Move ``pyspark.zip`` entries of ``path`` (default ``sys.path``, changed in place) to its end.

    Only when ``pyspark`` is not imported yet, a ``.../pyspark.zip`` entry exists and the package
    that the remaining entries find has the same ``__version__`` as the zip's
    ``pyspark/version.py``.

    :param path: the module search path to change (default ``sys.path``).
    :return: True if the zip entries were moved; False if nothing changed.
    :raises: nothing: any problem reading the zip or the package keeps the path as it is.
    """
    path = sys.path if path is None else path
    if "pyspark" in sys.modules and path is sys.path:
        return False
    zips = [p for p in path if os.path.basename(str(p)) == "pyspark.zip"]
    if not zips:
        return False
    try:
        with zipfile.ZipFile(zips[0]) as zf:
            zip_version = _version(zf.read("pyspark/version.py").decode("utf-8"))
        others = [p for p in path if p not in zips]
        spec = importlib.machinery.PathFinder.find_spec("pyspark", others)
        if spec is None or not spec.submodule_search_locations:
            return False
        package_dir = list(spec.submodule_search_locations)[0]
        with open(os.path.join(package_dir, "version.py"), encoding="utf-8") as fh:
            installed_version = _version(fh.read())
    except (OSError, KeyError, zipfile.BadZipFile, UnicodeDecodeError, ImportError, ValueError):
        return False
    if zip_version is None or zip_version != installed_version:
        return False
    path[:] = [p for p in path if p not in zips] + zips
    return True
