"""The package's layering rules, read from the source with ``ast`` (imports anywhere in a file).

* ``jetstream/`` (the JetStream client library) imports nothing of the Airflow side: ``hooks/``,
  ``operators/``, ``sensors/``, ``triggers/``, ``etl/``, ``ui/`` (and no Airflow at all:
  ``test_no_airflow_import``).
* The old paths of the JetStream library (``hooks.api`` …, ``completeness``) are thin shims
  (``_moved.moved_module``: a deprecation warning, then the module at its new path), and the
  project's own code imports ``jetstream/`` directly, never a shim.
* ``tables/`` and ``spark/`` import ``deltalake`` only inside functions: the Spark executors have
  no ``deltalake`` (``requirements-executor.txt``) and import these modules, and the DAG files
  import ``tables/`` while they are parsed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.unit.test_no_airflow_import import PACKAGE, imports_of

REPO = PACKAGE.parent
AIRFLOW_SIDE = ("hooks", "operators", "sensors", "triggers", "etl", "ui")
#: ``hooks/<name>.py`` → ``jetstream/<name>.py``, and ``completeness.py`` → ``jetstream/completeness.py``.
SHIMS = {f"airflow_provider_plgd.hooks.{m}": f"airflow_provider_plgd.jetstream.{m}"
         for m in ("api", "blocking", "client", "connection", "counting", "durable", "messages", "pull")}
SHIMS["airflow_provider_plgd.completeness"] = "airflow_provider_plgd.jetstream.completeness"
#: The project's own Python: the provider, the example DAGs, the Spark scripts, dev tools, benchmarks, tests.
OWN_CODE = ("airflow_provider_plgd", "dags", "spark_apps", "plgd_devtools", "bench", "tests")
#: Files that name the old paths on purpose: the shims, their helper, and the test of the old paths.
OLD_PATH_USERS = {"airflow_provider_plgd/_moved.py", "tests/unit/test_moved_modules.py"}


def _module_of(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _shim_path(module: str) -> Path:
    return REPO.joinpath(*module.split(".")).with_suffix(".py")


def forbidden_imports(path: Path, prefixes: tuple[str, ...], package: Path = PACKAGE) -> list[str]:
    """``"<module> (line n)"`` for each import of ``path`` that is one of ``prefixes`` or below one."""
    return [f"{name} (line {line})" for name, line in imports_of(path, package)
            if any(name == p or name.startswith(p + ".") for p in prefixes)]


def import_time_imports(path: Path) -> list[tuple[str, int]]:
    """The modules ``path`` imports when it is imported: statements of the module and class
    bodies (also under ``if``/``try``/``with``), not inside functions."""
    found: list[tuple[str, int]] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.extend((alias.name, node.lineno) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level:
                found.append((node.module or "", node.lineno))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            else:
                for field in ("body", "orelse", "finalbody"):
                    visit(getattr(node, field, None) or [])
                for handler in getattr(node, "handlers", None) or []:
                    visit(handler.body)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body)
    return found


def shim_problems(path: Path, new: str) -> list[str]:
    """What makes ``path`` more than a shim of module ``new``: any statement but the docstring,
    imports, ``moved_module(__name__, new)`` put in ``sys.modules`` or kept, and ``__getattr__``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    problems, calls = [], []
    for i, node in enumerate(tree.body):
        if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                and getattr(node.value.func, "id", None) == "moved_module":
            calls.append([a.value if isinstance(a, ast.Constant) else getattr(a, "id", None) for a in node.value.args])
            continue
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            continue
        problems.append(f"line {node.lineno}: {ast.unparse(node).splitlines()[0]}")
    if calls != [["__name__", new]]:
        problems.append(f"expected one moved_module(__name__, {new!r}), found {calls}")
    return problems


JETSTREAM = sorted((PACKAGE / "jetstream").rglob("*.py"))


@pytest.mark.parametrize("path", JETSTREAM, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_jetstream_imports_nothing_of_the_airflow_side(path):
    prefixes = tuple(f"airflow_provider_plgd.{p}" for p in AIRFLOW_SIDE)
    found = forbidden_imports(path, prefixes)
    assert not found, f"{_module_of(path)} imports the Airflow side: {found}"


def test_every_old_path_of_the_jetstream_library_is_listed():
    """A module of ``jetstream/`` with a namesake in ``hooks/`` is one of :data:`SHIMS`."""
    namesakes = {f"airflow_provider_plgd.hooks.{p.stem}" for p in (PACKAGE / "jetstream").glob("*.py")
                 if p.stem != "__init__" and (PACKAGE / "hooks" / p.name).is_file()}
    assert namesakes == {old for old in SHIMS if ".hooks." in old}


@pytest.mark.parametrize(("old", "new"), sorted(SHIMS.items()))
def test_an_old_path_is_a_thin_shim(old, new):
    assert shim_problems(_shim_path(old), new) == []


def _own_sources() -> list[Path]:
    return sorted(p for top in OWN_CODE for p in (REPO / top).rglob("*.py")
                  if str(p.relative_to(REPO)) not in OLD_PATH_USERS and _shim_path_of(p) is None)


def _shim_path_of(path: Path) -> str | None:
    return next((old for old in SHIMS if _shim_path(old) == path), None)


def test_the_project_imports_the_jetstream_library_directly():
    found = {str(p.relative_to(REPO)): hits for p in _own_sources()
             if (hits := forbidden_imports(p, tuple(SHIMS), PACKAGE))}
    assert not found, f"use airflow_provider_plgd.jetstream.*, not the deprecated paths: {found}"


NO_DELTALAKE_AT_IMPORT = sorted(p for pkg in ("tables", "spark") for p in (PACKAGE / pkg).rglob("*.py"))


@pytest.mark.parametrize("path", NO_DELTALAKE_AT_IMPORT, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_deltalake_is_imported_inside_functions_only(path):
    found = [f"{name} (line {line})" for name, line in import_time_imports(path)
             if name == "deltalake" or name.startswith("deltalake.")]
    assert not found, f"{_module_of(path)} imports deltalake when it is imported: {found}"


def test_the_checks_find_what_they_look_for(tmp_path):
    """The checkers themselves, on planted files."""
    pkg = tmp_path / "airflow_provider_plgd"
    for sub in ("jetstream", "hooks"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "hooks" / "base.py").write_text("")
    client = pkg / "jetstream" / "client.py"
    client.write_text("import json\n\ndef f():\n    from ..hooks import base\n")
    assert forbidden_imports(client, ("airflow_provider_plgd.hooks",), pkg) == [
        "airflow_provider_plgd.hooks (line 4)", "airflow_provider_plgd.hooks.base (line 4)"]

    lazy = tmp_path / "lazy.py"
    lazy.write_text("import json\ntry:\n    import deltalake.transaction\nexcept ImportError:\n    pass\n"
                    "class A:\n    from deltalake import DeltaTable\n    def f(self):\n        import deltalake\n")
    assert import_time_imports(lazy) == [("json", 1), ("deltalake.transaction", 3), ("deltalake", 7)]

    shim = tmp_path / "shim.py"
    shim.write_text('"""doc"""\nimport sys\nfrom x import moved_module\n'
                    'sys.modules[__name__] = moved_module(__name__, "a.new")\n')
    assert shim_problems(shim, "a.new") == []
    shim.write_text(shim.read_text() + "def helper():\n    return 1\n")
    assert shim_problems(shim, "a.new") == ["line 5: def helper():"]
    assert shim_problems(shim, "a.other") == ["line 5: def helper():",
                                              "expected one moved_module(__name__, 'a.other'), found [['__name__', 'a.new']]"]
