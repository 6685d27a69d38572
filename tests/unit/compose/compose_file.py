"""The model of ``docker-compose.airflow.yml`` that the compose checks read: the paths, the expected
services, and helpers that resolve ``${VAR:-default}``, environments, mounts, commands and image
pins as ``docker compose`` does (module docstring of test_compose.py).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
COMPOSE_FILE = REPO / "docker-compose.airflow.yml"
STREAM_CONFIG = REPO / "docker" / "nats" / "jetstream.json"
DOCS = REPO / "docs" / "compose.md"

#: role -> service name; every role must exist.
REQUIRED_SERVICES = {
    "metadata DB": "postgres",
    "airflow init": "airflow-init",
    "airflow api-server": "airflow-api-server",
    "airflow scheduler": "airflow-scheduler",
    "airflow dag-processor": "airflow-dag-processor",
    "airflow triggerer": "airflow-triggerer",
    "nats": "nats",
    "stream init": "nats-init",
    "spark master": "spark-master",
    "spark worker": "spark-worker",
    "simulator": "simulator",
}
AIRFLOW_COMMANDS = {
    "airflow-api-server": "api-server",
    "airflow-scheduler": "scheduler",
    "airflow-dag-processor": "dag-processor",
    "airflow-triggerer": "triggerer",
}
#: services that run once and exit (``restart: "no"``); every other service is long-running.
ONE_SHOT_SERVICES = {"airflow-init", "nats-init", "simulator"}
#: flags of ``plgd-simulate`` (setup.cfg console script; airflow_provider_plgd.simulator.cli).
SIMULATOR_FLAGS = {
    "--servers", "--stream", "--create-stream", "--seed", "--owners", "--devices", "--resources",
    "--intervals", "--interval-seconds", "--faults", "--ground-truth", "--no-wait",
}
#: images whose exact tags have two numeric parts (postgres 16.9 is a patch release).
TWO_PART_VERSIONED_IMAGES = {"postgres"}
DEPENDS_ON_CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
SECRET_ENV = re.compile(r"PASSWORD|SECRET|FERNET|TOKEN|_KEY$")

# --------------------------------------------------------------------------------------------
# helpers


_VAR_RE = re.compile(r"\$(?:(?P<escaped>\$)|\{(?P<braced>[^{}]*)\}|(?P<named>[A-Za-z_][A-Za-z0-9_]*))")
_BRACED_RE = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>.*))?", re.S)


def interpolate(text: str, variables: dict[str, str | None]) -> str:
    """Compose interpolation with an empty environment: ``${VAR:-d}``/``${VAR-d}`` -> ``d``, ``$$`` -> ``$``.

    Records every variable in ``variables`` (name -> default, or None when it has none).
    """

    def repl(match: re.Match) -> str:
        if match.group("escaped"):
            return "$"
        if match.group("named"):
            variables.setdefault(match.group("named"), None)
            return ""
        braced = _BRACED_RE.fullmatch(match.group("braced"))
        assert braced, f"cannot parse interpolation {match.group(0)!r}"
        name, op, arg = braced.group("name", "op", "arg")
        if op in (":-", "-"):
            variables[name] = arg
            return arg
        variables.setdefault(name, None)
        return ""

    return _VAR_RE.sub(repl, text)


def interpolate_tree(node, variables: dict[str, str | None]):
    if isinstance(node, str):
        return interpolate(node, variables)
    if isinstance(node, list):
        return [interpolate_tree(item, variables) for item in node]
    if isinstance(node, dict):
        return {key: interpolate_tree(value, variables) for key, value in node.items()}
    return node


def env_of(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def depends_on_of(service: dict) -> dict[str, dict]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return {name: {"condition": "service_started"} for name in deps}
    return {name: (spec or {"condition": "service_started"}) for name, spec in deps.items()}


def mounts_of(service: dict) -> list[dict]:
    """Volumes as dicts: type ('volume' or 'bind'), source, target, read_only."""
    out = []
    for item in service.get("volumes") or []:
        if isinstance(item, dict):
            out.append({"type": item.get("type", "volume"), "source": item.get("source"),
                        "target": item["target"], "read_only": bool(item.get("read_only"))})
            continue
        parts = item.split(":")
        if len(parts) == 1:  # anonymous volume
            out.append({"type": "volume", "source": None, "target": parts[0], "read_only": False})
            continue
        source, target = parts[0], parts[1]
        kind = "bind" if source.startswith((".", "/", "~")) else "volume"
        out.append({"type": kind, "source": source, "target": target,
                    "read_only": len(parts) > 2 and "ro" in parts[2].split(",")})
    return out


def command_tokens(service: dict) -> list[str]:
    tokens: list[str] = []
    for key in ("entrypoint", "command"):
        value = service.get(key)
        if value is None:
            continue
        for part in [value] if isinstance(value, str) else value:
            tokens.extend(re.split(r"[\s;|&()'\"]+", str(part)))
    return [t for t in tokens if t]


def command_list(service: dict) -> list[str]:
    value = service.get("command")
    if value is None:
        return []
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def flag_value(args: list[str], flag: str) -> str:
    assert flag in args, f"{flag} missing from {args}"
    return args[args.index(flag) + 1]


def pin_problem(ref: str) -> str | None:
    """None when ``ref`` names an exact image version; else what is wrong."""
    if "$" in ref:
        return f"{ref!r} has an unresolved variable"
    if "@sha256:" in ref:
        return None
    last = ref.rsplit("/", 1)[-1]
    if ":" not in last:
        return f"{ref!r} has no tag (means :latest)"
    repo, tag = ref.rsplit(":", 1)
    if "latest" in tag.lower():
        return f"{ref!r} uses a latest tag"
    if re.search(r"\d+\.\d+\.\d+", tag):
        return None
    if repo.rsplit("/", 1)[-1] in TWO_PART_VERSIONED_IMAGES and re.match(r"\d+\.\d+(\D|$)", tag):
        return None
    return f"{ref!r}: tag {tag!r} is not an exact version (floating tag)"


def dockerfile_from_images(path: Path) -> list[str]:
    """The image references of every ``FROM`` (ARG defaults resolved; earlier stage names excluded)."""
    text = re.sub(r"\\\n", " ", path.read_text())
    args: dict[str, str] = {}
    stages: set[str] = set()
    images: list[str] = []
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        instruction = words[0].upper()
        if instruction == "ARG" and not images and len(words) > 1 and "=" in words[1]:
            name, default = words[1].split("=", 1)
            args[name] = default.strip("\"'")
        elif instruction == "FROM":
            rest = [w for w in words[1:] if not w.startswith("--")]
            ref = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: args.get(m.group(1), m.group(0)), rest[0])
            if ref not in stages:
                images.append(ref)
            if len(rest) >= 3 and rest[1].upper() == "AS":
                stages.add(rest[2])
    return images


def master_url(conn: dict) -> str:
    """The master URL the Spark provider builds (SparkSubmitHook._resolve_connection)."""
    host, port = conn.get("host") or "", conn.get("port")
    if conn["conn_type"] == "spark" and host and ("://" in host or not port):
        master = host
    else:
        master = f"{conn['conn_type']}://{host}"
    return f"{master}:{port}" if port else master
