"""The trust boundary of the ETL DAG's run params: what a user who may only trigger the DAG can set.

Airflow's security model trusts DAG authors (who write the DAG file and call ``build_etl_dag``)
and the deployment manager, not the UI or REST API users who may trigger a DAG (Airflow docs,
"Security Model": "DAG authors" vs "Authenticated UI users"). A run param is such a user's input.
Each one that reaches a command line, a Spark setting, a path, a URL or a subject passes a check
here that the DAG author controls, in ``plan`` (before anything is read or written) and, for
``spark_conf``, again in each Spark task before ``spark-submit`` starts:

* ``spark_conf``: only the keys of the DAG's allowlist (``build_etl_dag(run_spark_conf_keys=…)``,
  default :data:`DEFAULT_RUN_SPARK_CONF_KEYS`: executor memory, cores and instances, shuffle
  partitions, default parallelism, dynamic-allocation bounds), each value matching its pattern.
  Anything else (``spark.driver.extraJavaOptions``, class paths, the Python interpreters,
  ``spark.executorEnv.*``, …) could run code in the Airflow worker or the executors.
* ``storage_root``: ``""`` (the connection's ``storage_root`` extra, else ``$AIRFLOW_HOME/plgd``), the
  DAG's own default, the connection's root, or a root of ``build_etl_dag(storage_roots=…)`` or a
  folder below one, compared as fsspec and delta-rs resolve them; never one strictly inside or
  above the root the DAG writes by default or the connection's (:func:`check_root_apart`; what the
  storage holds is checked in ``plan``: ``tables.root_guard``).
* the pipeline's identity (``airflow_provider_plgd.tables.identity``): ``stream``, ``lookback_intervals``
  and ``max_content_bytes`` only with the DAG author's value; ``owners`` and ``event_types`` the
  author's too, or on another allowed root a subset of them (:func:`check_identity_params`); each
  also checked in form (stream name, ``fetch.selection.Selection.of``, bounds).
* ``settle_seconds``, ``max_fetch_tasks`` and ``accept_fewer_messages``: numbers within bounds, a boolean.

The table of who may set what: ``docs/operations.md``, "Who may set what".
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_plgd.coerce import parse_bool, token_list
from airflow_provider_plgd.exceptions import PipelineIdentityError, StorageRootOverlapError, UntrustedRunParamError
from airflow_provider_plgd.fetch.selection import Selection
from airflow_provider_plgd.jetstream.connection import check_stream_name
from airflow_provider_plgd.plgd.event_types import EVENT_TYPES
from airflow_provider_plgd.tables.layout import Layout

__all__ = [
    "DEFAULT_RUN_SPARK_CONF_KEYS",
    "IDENTITY_PARAMS",
    "NUMBER_BOUNDS",
    "STORAGE_ROOTS_ENV",
    "RunParams",
    "UntrustedRunParamError",
    "check_identity_params",
    "check_root_apart",
    "check_run",
    "check_run_params",
    "check_run_spark_conf",
    "check_run_storage_root",
    "env_storage_roots",
    "own_roots",
    "run_spark_conf_policy",
]

_MEMORY = r"[1-9][0-9]{0,6}[kmgtKMGT]?[bB]?"  # Spark's size strings: 512m, 4g, 4096M
_COUNT = r"[1-9][0-9]{0,5}"
_COUNT_OR_ZERO = r"0|[1-9][0-9]{0,5}"

#: Spark settings a run may set with the ``spark_conf`` param unless the DAG author says otherwise
#: (``build_etl_dag(run_spark_conf_keys=…)``): resources only, each with the pattern its value must
#: match in full (Spark docs, "Configuration": "Application Properties", "Execution Behavior",
#: "Dynamic Allocation").
DEFAULT_RUN_SPARK_CONF_KEYS: dict[str, str] = {
    "spark.executor.memory": _MEMORY,
    "spark.executor.cores": _COUNT,
    "spark.executor.instances": _COUNT,
    "spark.sql.shuffle.partitions": _COUNT,
    "spark.default.parallelism": _COUNT,
    "spark.dynamicAllocation.minExecutors": _COUNT_OR_ZERO,
    "spark.dynamicAllocation.initialExecutors": _COUNT_OR_ZERO,
    "spark.dynamicAllocation.maxExecutors": _COUNT,
}

#: ``(minimum, maximum)`` of each number param: a run cannot ask for a million fetch tasks or a
#: decode limit beyond what a worker holds.
NUMBER_BOUNDS: dict[str, tuple[int, int]] = {
    "settle_seconds": (0, 7 * 24 * 3600),
    "max_fetch_tasks": (1, 1024),
    "lookback_intervals": (0, 100_000),
    "max_content_bytes": (1, 1 << 30),
}


def run_spark_conf_policy(keys: Mapping[str, str | None] | Iterable[str] | None) -> dict[str, str | None]:
    """The ``spark_conf`` allowlist of a DAG: setting -> pattern of its value (None: any scalar).

    :param keys: ``None``: :data:`DEFAULT_RUN_SPARK_CONF_KEYS`; a mapping: the DAG author's own
        patterns; an iterable of setting names: those, with our pattern for the ones in
        :data:`DEFAULT_RUN_SPARK_CONF_KEYS` and any value for the others (the author's choice).
    :raises TypeError: ``keys`` holds a non-string name or pattern.
    """
    if keys is None:
        return dict(DEFAULT_RUN_SPARK_CONF_KEYS)
    policy = dict(keys) if isinstance(keys, Mapping) else {k: DEFAULT_RUN_SPARK_CONF_KEYS.get(k) for k in keys}
    for key, pattern in policy.items():
        if not isinstance(key, str) or not key or not (pattern is None or isinstance(pattern, str)):
            raise TypeError(f"run_spark_conf_keys entry {key!r}: {pattern!r} must be a Spark setting name and a "
                            "regular expression (or None)")
    return policy


def check_run_spark_conf(value: Any, policy: Mapping[str, str | None], *,
                         param: str = "spark_conf") -> dict[str, str | None]:
    """The ``spark_conf`` run param as ``{setting: string value, or None to remove it}``, checked.

    :param value: an object of Spark settings, a JSON string of one, or ``None``/``""``/``{}``.
    :param policy: :func:`run_spark_conf_policy`.
    :raises UntrustedRunParamError: not an object of scalar values; a setting outside ``policy``
        (the message names it and ``build_etl_dag(run_spark_conf_keys=…)``); a value that does not
        match its pattern (the message names the setting, the value and the pattern).
    """
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise UntrustedRunParamError(f"run param {param!r} must be a JSON object of Spark settings, "
                                         f"got {value!r}") from None
    if not isinstance(value, Mapping):
        raise UntrustedRunParamError(f"run param {param!r} must be an object of Spark settings, got {value!r}")
    checked: dict[str, str | None] = {}
    for key, raw in value.items():
        if not isinstance(key, str) or key not in policy:
            allowed = ", ".join(sorted(policy)) or "none"
            raise UntrustedRunParamError(
                f"run param {param!r}: the Spark setting {key!r} may not be set by a run (allowed: {allowed}); "
                "nothing was started. A DAG author who trusts every user who may trigger this DAG allows it "
                "with build_etl_dag(run_spark_conf_keys=...), or sets it for every run with "
                "build_etl_dag(spark_conf=...) (docs/operations.md, \"Who may set what\")"
            )
        if raw is None:
            checked[key] = None
            continue
        if not isinstance(raw, (str, int, float, bool)):
            raise UntrustedRunParamError(f"run param {param!r}: {key} must be a string or number, got {raw!r}")
        text = str(raw).lower() if isinstance(raw, bool) else str(raw)
        pattern = policy[key]
        if pattern is not None and not re.fullmatch(pattern, text):
            raise UntrustedRunParamError(f"run param {param!r}: {key}={text!r} does not match {pattern!r} "
                                         "(e.g. 4g for a memory size, 8 for a count)")
        checked[key] = text
    return checked


#: Environment variable of the shipped DAG files (the ETL DAG and the examples): a JSON list of the
#: storage roots a run may choose with the ``storage_root`` param. The deployment manager sets it.
STORAGE_ROOTS_ENV = "PLGD_ETL_STORAGE_ROOTS"


def env_storage_roots(variable: str = STORAGE_ROOTS_ENV) -> list[str]:
    """The JSON list of strings in the environment variable ``variable`` (``[]`` when unset or empty).

    :raises ValueError: not a JSON list of strings (names the variable and the value).
    """
    value = os.environ.get(variable, "").strip()
    if not value:
        return []
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = None
    if not isinstance(parsed, list) or not all(isinstance(v, str) for v in parsed):
        raise ValueError(f"{variable} must be a JSON list of strings, got {value!r}")
    return parsed


def check_run_storage_root(value: Any, allowed: Iterable[str], jetstream_conn_id: str) -> str:
    """The ``storage_root`` run param, checked: ``""``, a root the DAG author or the connection
    names, or a folder below one of ``allowed``, compared in the one spelling that fsspec and
    delta-rs both resolve to the same place (``Layout.of``, ``storage_root.normalize_storage_root``: no percent
    escape, no ``.`` or ``..`` segment, scheme and bucket in lowercase).

    :param allowed: the DAG's default root and ``build_etl_dag(storage_roots=…)`` (each also
        allows the folders below it).
    :param jetstream_conn_id: its ``storage_root`` extra is allowed too.
    :return: the value to resolve (``""`` or the normalized root).
    :raises UntrustedRunParamError: not a string, a root the storage layers would resolve
        differently (``normalize_storage_root``'s refusals), or a root nobody allowed (named, with
        the allowed ones).
    """
    # lazy: the hooks and storage-root checks load when a run is checked, not when a DAG file is parsed
    from airflow_provider_plgd.hooks.base import connection_storage_root
    from airflow_provider_plgd.tables.storage_root import same_or_below

    if value is None or value == "":
        return ""
    if not isinstance(value, str):
        raise UntrustedRunParamError(f"run param 'storage_root' must be a string, got {value!r}")
    try:
        root = Layout.of(value).root
    except ValueError as err:
        raise UntrustedRunParamError(f"run param 'storage_root': {err}") from None
    roots = {Layout.of(r).root for r in allowed if r}
    if any(same_or_below(root, base) for base in roots):
        return root
    conn_root = connection_storage_root(jetstream_conn_id)
    if conn_root and Layout.of(conn_root).root == root:
        return root
    raise UntrustedRunParamError(
        f"run param 'storage_root' {root!r} is not a root this DAG allows:\n"
        f"  {', '.join(sorted(roots)) or 'none'} and the folders below them,\n"
        "  the connection's storage_root, or empty for the default.\n"
        "Nothing was read or written. The DAG author allows more roots with\n"
        "build_etl_dag(storage_roots=[...]) (docs/operations.md, \"Who may set what\")."
    )


@dataclass(frozen=True)
class RunParams:
    """The checked run params (``plan`` uses them; the others reach tasks through their own checks).

    :ivar owners: checked owner IDs; ``()`` every owner.
    :ivar event_types: checked event types (every one when the param is empty).
    """

    stream: str
    storage_root: str  # "" (resolve the default) or an allowed root
    spark_conf: dict[str, str | None]
    numbers: dict[str, float]  # NUMBER_BOUNDS: settle_seconds a float, the others ints
    accept_fewer_messages: bool
    owners: tuple[str, ...] = ()
    event_types: tuple[str, ...] = ()

    def identity(self) -> dict[str, Any]:
        """The values of :data:`IDENTITY_PARAMS` (``owners`` None for every owner)."""
        return {"stream": self.stream, "owners": list(self.owners) or None, "event_types": list(self.event_types),
                "lookback_intervals": int(self.numbers["lookback_intervals"]),
                "max_content_bytes": int(self.numbers["max_content_bytes"])}


def check_run_params(params: Mapping[str, Any], *, spark_conf_policy: Mapping[str, str | None],
                     storage_roots: Iterable[str], jetstream_conn_id: str) -> RunParams:
    """Check every run param of the ETL DAG that reaches a command line, a setting, a path or a
    subject (see the module; ``owners`` and ``event_types`` through ``Selection.of``).

    :raises UntrustedRunParamError: the first param that fails, named with its value.
    """
    try:
        stream = check_stream_name(params.get("stream"), "run param 'stream'")
        selection = Selection.of(token_list(params.get("owners"), "owner_id"),
                                 token_list(params.get("event_types"), "event_type") or EVENT_TYPES)
    except ValueError as err:
        raise UntrustedRunParamError(str(err)) from None
    numbers: dict[str, float] = {}
    for name, (low, high) in NUMBER_BOUNDS.items():
        raw = params.get(name)
        try:
            if isinstance(raw, bool) or raw is None:
                raise ValueError
            number = float(str(raw).strip()) if name == "settle_seconds" else int(str(raw).strip())
        except ValueError:
            raise UntrustedRunParamError(f"run param {name!r} must be a number from {low} to {high}, "
                                         f"got {raw!r}") from None
        if not low <= number <= high:  # also NaN
            raise UntrustedRunParamError(f"run param {name!r} must be a number from {low} to {high}, got {raw!r}")
        numbers[name] = number
    try:
        accept_fewer = parse_bool(params.get("accept_fewer_messages", False), "run param 'accept_fewer_messages'")
    except ValueError as err:
        raise UntrustedRunParamError(str(err)) from None
    return RunParams(
        stream=stream,
        storage_root=check_run_storage_root(params.get("storage_root"), storage_roots, jetstream_conn_id),
        spark_conf=check_run_spark_conf(params.get("spark_conf"), spark_conf_policy),
        numbers=numbers,
        accept_fewer_messages=accept_fewer,
        owners=tuple(dict.fromkeys(selection.owners)),
        event_types=tuple(dict.fromkeys(selection.event_types)),
    )


#: The run params that are part of the pipeline's identity (``identity.SETTINGS``; the storage
#: root has its own rule, :func:`check_run_storage_root`).
IDENTITY_PARAMS = ("stream", "owners", "event_types", "lookback_intervals", "max_content_bytes")


def own_roots(author: RunParams, jetstream_conn_id: str) -> tuple[str, ...]:
    """The roots the DAG writes by its own settings: its default root resolved (the author's
    ``storage_root``, else the connection's ``storage_root`` extra, else ``$AIRFLOW_HOME/plgd``),
    then the connection's root when it has one and it is another (normalised spelling).

    :raises ValueError: a root that is refused (``normalize_storage_root``).
    """
    # lazy: the hooks load when a run is checked, not when a DAG file is parsed
    from airflow_provider_plgd.hooks.base import connection_storage_root, resolve_layout

    default = resolve_layout(author.storage_root, jetstream_conn_id).root
    conn = connection_storage_root(jetstream_conn_id)
    conn_root = Layout.of(conn).root if conn else None
    return (default,) if conn_root is None or conn_root == default else (default, conn_root)


def check_root_apart(run: RunParams, author: RunParams, jetstream_conn_id: str) -> str:
    """The run's root resolved, refused when it lies strictly inside, or strictly above, a root the
    DAG writes by its own settings (:func:`own_roots`; ``tables.root_guard.check_apart_of``). The
    DAG's default root itself passes. No I/O (the connection is read).

    :return: the run's root (normalised spelling).
    :raises StorageRootOverlapError: names both roots.
    """
    # lazy: the hooks and table checks load when a run is checked, not when a DAG file is parsed
    from airflow_provider_plgd.hooks.base import resolve_layout
    from airflow_provider_plgd.tables.root_guard import check_apart_of

    root = resolve_layout(run.storage_root, jetstream_conn_id).root
    mine = own_roots(author, jetstream_conn_id)
    if root != mine[0]:
        check_apart_of(root, mine)
    return root


def check_identity_params(run: RunParams, author: RunParams, jetstream_conn_id: str | None = None) -> None:
    """Refuse a run whose identity params (:data:`IDENTITY_PARAMS`) differ from the DAG author's.

    On the DAG's own storage root (the root the author's default resolves to, however the run
    spells it: ``""``, the default, or the connection's root when the default is ``""``) each must
    equal the author's value. On another root the author allows (``build_etl_dag(storage_roots=…)``)
    a run may write a narrower view: a subset of the author's owners and event types; the stream,
    the lookback and the decode limit stay the author's. The identity recorded at a root binds
    every later run there, one with the author's own settings too (``identity.check_recorded`` in
    ``plan``). No I/O: it runs first in ``wait_for_interval``, again in ``plan``.

    :param run: the run's checked params; ``author``: the DAG's own (``check_run_params`` of its defaults).
    :param jetstream_conn_id: the connection whose ``storage_root`` extra ``""`` resolves to (None:
        the roots are compared as given).
    :raises PipelineIdentityError: names each setting, the DAG author's value and the run's.
    """
    # lazy: the hooks and table checks load when a run is checked, not when a DAG file is parsed
    from airflow_provider_plgd.hooks.base import resolve_layout
    from airflow_provider_plgd.tables import identity

    mine, theirs = run.identity(), author.identity()
    own_root = run.storage_root in ("", author.storage_root) or (
        jetstream_conn_id is not None
        and resolve_layout(run.storage_root, jetstream_conn_id) == resolve_layout(author.storage_root,
                                                                                  jetstream_conn_id))
    found = []
    for name in IDENTITY_PARAMS:
        if name in ("owners", "event_types") and not own_root:
            allowed = theirs[name]
            if allowed is None or (mine[name] is not None and set(mine[name]) <= set(allowed)):
                continue
            found.append((name, allowed, mine[name]))
        elif identity.differences({name: theirs[name]}, {name: mine[name]}):
            found.append((name, theirs[name], mine[name]))
    if found:
        raise identity.identity_error(
            found, where="the DAG author's", what="A user who may trigger the DAG may not change them"
            + (" (on this root; on another root the DAG author allows, a run may select fewer owners or event "
               "types)." if own_root else " (on another root, only the owners and event types may be narrower)."))


def check_run(params: Mapping[str, Any], author: RunParams, *, spark_conf_policy: Mapping[str, str | None],
              storage_roots: Iterable[str], jetstream_conn_id: str) -> RunParams:
    """:func:`check_run_params`, then :func:`check_identity_params` against the DAG author's: the
    checks of the ETL DAG's first task (``wait_for_interval``) and of ``plan``, before any I/O.

    The run's root is checked against the roots the DAG writes too (:func:`check_root_apart`).

    :raises UntrustedRunParamError: a param outside what the DAG author allows; also (its message
        starting with ``StorageRootOverlapError:`` or ``PipelineIdentityError:``, the cause kept) a
        root inside or above one the DAG writes, or a param that changes the pipeline's identity.
        No retries.
    """
    checked = check_run_params(params, spark_conf_policy=spark_conf_policy, storage_roots=storage_roots,
                               jetstream_conn_id=jetstream_conn_id)
    try:
        check_root_apart(checked, author, jetstream_conn_id)
        check_identity_params(checked, author, jetstream_conn_id)
    except (PipelineIdentityError, StorageRootOverlapError) as err:
        raise UntrustedRunParamError(f"{type(err).__name__}: {err}") from err
    return checked
