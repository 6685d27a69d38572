"""tables/, spark/ and jetstream/ import no Airflow, not even inside a function.

The Spark executors have no Airflow, and the tables are read and written from tools without it: the
three packages take plain values (a storage root, connection settings) and the Airflow side
(hooks, operators, ``etl``) looks them up. Read from the source with ``ast``, so an import inside a
function that no test happens to run is found too; the provider's own imports are followed, so a
module that reaches Airflow through another one of the provider fails as well.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "airflow_provider_plgd"
CHECKED = ("tables", "spark", "jetstream")
#: ``exceptions/__init__.py`` imports its Airflow-bound errors on first use of their names only (its
#: module ``__getattr__``); asking for one of them is an Airflow-side act, never done in the three packages.
LAZY_AIRFLOW_NAMES = {("airflow_provider_plgd.exceptions", "airflow_provider_plgd.exceptions.airflow_tasks")}


def _module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _path_of(module: str, package: Path) -> Path | None:
    base = package.parent.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imports_of(path: Path, package_dir: Path) -> list[tuple[str, int]]:
    """Every module ``path`` imports, anywhere in the file (absolute dotted names, with the line)."""
    module = _module_name(path, package_dir)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((target, node.lineno))
            # ``from airflow_provider_plgd.x import y``: y may be a module
            found += [(f"{target}.{alias.name}", node.lineno) for alias in node.names
                      if _path_of(f"{target}.{alias.name}", package_dir) is not None]
    return found


def _is_airflow(name: str) -> bool:
    return name == "airflow" or name.startswith("airflow.")


def airflow_paths(start: Path, package: Path = PACKAGE) -> list[str]:
    """The chains of imports from ``start`` to an ``airflow`` module (empty: none)."""
    chains, seen = [], set()
    todo = [(start, [_module_name(start, package)])]
    while todo:
        path, chain = todo.pop()
        for name, line in imports_of(path, package):
            step = [*chain, f"{name} (line {line})"]
            if _is_airflow(name):
                chains.append(" -> ".join(step))
            elif name.startswith("airflow_provider_plgd") and (_module_name(path, package), name) not in LAZY_AIRFLOW_NAMES:
                target = _path_of(name, package)
                if target is not None and target not in seen:
                    seen.add(target)
                    todo.append((target, step))
    return chains


SOURCES = sorted(p for pkg in CHECKED for p in (PACKAGE / pkg).rglob("*.py"))


def test_the_walk_sees_every_package():
    assert {p.relative_to(PACKAGE).parts[0] for p in SOURCES} == set(CHECKED)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_airflow_import(path):
    chains = airflow_paths(path)
    assert not chains, "Airflow is imported:\n" + "\n".join(chains)


def test_the_walk_finds_an_import_inside_a_function(tmp_path):
    """The check itself: an Airflow import inside a function, and one reached through a hook."""
    pkg = tmp_path / "airflow_provider_plgd"
    (pkg / "tables").mkdir(parents=True)
    (pkg / "hooks").mkdir()
    for init in (pkg / "__init__.py", pkg / "tables" / "__init__.py", pkg / "hooks" / "__init__.py"):
        init.write_text("")
    (pkg / "tables" / "direct.py").write_text("def f():\n    from airflow.sdk import BaseHook\n")
    (pkg / "tables" / "indirect.py").write_text("def f():\n    from ..hooks import base\n")
    (pkg / "tables" / "via_sibling.py").write_text("import json\nfrom . import direct as _unused_name_only\n")
    (pkg / "hooks" / "base.py").write_text("import airflow\n")
    assert airflow_paths(pkg / "tables" / "direct.py", pkg) == [
        "airflow_provider_plgd.tables.direct -> airflow.sdk (line 2)"]
    assert airflow_paths(pkg / "tables" / "indirect.py", pkg) == [
        "airflow_provider_plgd.tables.indirect -> airflow_provider_plgd.hooks.base (line 2) -> airflow (line 1)"]
    assert airflow_paths(pkg / "tables" / "via_sibling.py", pkg) == [
        "airflow_provider_plgd.tables.via_sibling -> airflow_provider_plgd.tables.direct (line 2) -> airflow.sdk (line 2)"]
