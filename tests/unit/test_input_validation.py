"""Owner IDs, event types and stream names from params, connections or subjects can never build a
subject wildcard or a path outside the storage root.

Hostile values go to every place that turns them into a subject or a path: the token rule
(``plgd.subjects.validate_token``), the subject filters, the fetch operator's ``owner_id``/
``event_type``/``owner_ids``/``event_types``/``stream``, the ETL DAG's ``plan`` step, the staging
writer and reader, and the hook's stream name. Each must raise a ``ValueError`` that names the
value, before any connection is opened or any file is written: the tests snapshot the whole temp
directory (the storage root's parent) and require it unchanged.
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

from airflow_provider_plgd.plgd.subjects import subject_filters, validate_token
from airflow_provider_plgd.tables import staging, staging_commits
from airflow_provider_plgd.tables.layout import Layout

UTC = timezone.utc
OWNER = "e1407479-3136-56c0-9908-bb02fb0339e2"

#: Values that must never become a subject token or a path segment.
HOSTILE = [
    "*", ">", "a*", "a>", "plgd.>", ".", "..", "../..", "a..b", "a.b", "/", "/etc/passwd", "../../etc",
    "a/b", "a\\b", "C:\\Windows", "..\\..", "a=b", "owner_id=x", "[ab]", "a?", "", " ", "a b", "a\tb",
    "a\nb", "\r", "a\x00b", "a\x1bb", "a\x7fb", "a\x85b", "a\u00a0b", "a\u2028b", "a\u202eb", "\ufeffa",
]

#: The subset that is unsafe in a path (``>`` and a single ``.`` inside a value are path-safe; the
#: token rule rejects them for subjects).
PATH_HOSTILE = [v for v in HOSTILE if v not in (">", "a>", "plgd.>", "a.b")]


def tree(path: Path) -> list[str]:
    """Every file and folder under ``path`` (relative), sorted."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def named(value: str) -> str:
    """How error messages quote a value (``repr``); the empty value is named by its field only."""
    return repr(value) if value else ""


# ---------------------------------------------------------------------------------------------
# the token rule and subject filters


@pytest.mark.parametrize("value", HOSTILE)
def test_validate_token_rejects_wildcards_separators_and_control_characters(value):
    with pytest.raises(ValueError) as err:
        validate_token(value, "owner_id")
    assert "owner_id" in str(err.value) and named(value) in str(err.value)


@pytest.mark.parametrize("value", [OWNER, "devicesregistered", "urn:uuid:x", "owner_ünï", "_filter", "a-b_c~d"])
def test_validate_token_accepts_plain_tokens(value):
    assert validate_token(value, "owner_id") == value


@pytest.mark.parametrize("value", [v for v in HOSTILE if v != "*"])  # "*" alone is the documented all-owners filter
def test_subject_filters_never_widen_for_a_hostile_owner(value):
    with pytest.raises(ValueError, match="owner_id"):
        subject_filters(value, "devicesregistered")


@pytest.mark.parametrize("value", [*HOSTILE, "DevicesRegistered", "nosuchevent"])
def test_subject_filters_reject_hostile_event_types(value):
    with pytest.raises(ValueError):
        subject_filters(OWNER, value)


def test_validate_token_type_errors_name_the_field():
    for value in (None, 1, b"owner", ["a"]):
        with pytest.raises(TypeError, match="owner_id"):
            validate_token(value, "owner_id")


# ---------------------------------------------------------------------------------------------
# the fetch operator: fails before connecting or writing


@pytest.fixture
def unreachable_conn(monkeypatch):
    """A connection to TEST-NET-1: any attempt to connect would take seconds and fail differently."""
    monkeypatch.setenv("AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT",
                       json.dumps({"conn_type": "plgd_jetstream", "host": "192.0.2.1", "port": 4222}))


def run_op(**kwargs):
    from airflow_provider_plgd.operators.jetstream_to_staging import JetStreamToStagingOperator

    return JetStreamToStagingOperator(task_id="fetch", start_seq=1, **kwargs).execute({"params": {}})


@pytest.mark.parametrize("value", HOSTILE)
def test_operator_rejects_hostile_owner_ids_before_any_connection_or_file(value, tmp_path, unreachable_conn):
    root = tmp_path / "root"
    for kwargs in ({"owner_id": value, "event_type": "devicesregistered"},
                   {"owner_ids": [OWNER, value], "event_types": ["devicesregistered"]}):
        with pytest.raises(ValueError) as err:
            run_op(storage_root=str(root), **kwargs)
        assert "owner_id" in str(err.value) and named(value) in str(err.value)
    assert tree(tmp_path) == []


@pytest.mark.parametrize("value", HOSTILE)
def test_operator_rejects_hostile_event_types_before_any_connection_or_file(value, tmp_path, unreachable_conn):
    root = tmp_path / "root"
    for kwargs in ({"owner_id": OWNER, "event_type": value},
                   {"owner_ids": [OWNER], "event_types": ["devicesregistered", value]}):
        with pytest.raises(ValueError) as err:
            run_op(storage_root=str(root), **kwargs)
        assert "event_type" in str(err.value) and named(value) in str(err.value)
    assert tree(tmp_path) == []


@pytest.mark.parametrize("value", ["EV.X", "*", ">", "a b", "../x", "/abs", "a\\b", "a\x00b", ".", ".."])
def test_operator_rejects_hostile_stream_names(value, tmp_path, unreachable_conn):
    with pytest.raises(ValueError) as err:
        run_op(storage_root=str(tmp_path / "root"), owner_id=OWNER, event_type="devicesregistered", stream=value)
    assert named(value) in str(err.value)
    assert tree(tmp_path) == []


@pytest.mark.parametrize("value", ["EV.X", "*", ">", "a b", "../x", "a/b", "a\\b", "a\x00b", "a\u202eb"])
def test_hook_rejects_hostile_stream_names_from_the_connection_or_argument(value):
    from airflow_provider_plgd.jetstream.connection import check_stream_name, settings_from_connection

    conn = SimpleNamespace(conn_id="c", host="127.0.0.1", port=4222, login=None, password=None, extra_dejson={})
    for call in (lambda: settings_from_connection(SimpleNamespace(**{**vars(conn), "extra_dejson": {"stream": value}})),
                 lambda: settings_from_connection(conn, stream=value),
                 lambda: check_stream_name(value)):
        with pytest.raises(ValueError) as err:
            call()
        assert "stream" in str(err.value) and repr(value) in str(err.value)
    assert settings_from_connection(conn).stream == "EVENTS"
    with pytest.raises(ValueError, match="non-empty stream name"):
        check_stream_name("")


# ---------------------------------------------------------------------------------------------
# the ETL DAG's plan step


@pytest.fixture(scope="module")
def plan_callable():
    from airflow_provider_plgd.etl import DEFAULT_PARAMS, build_etl_dag

    def call(tmp_path: Path, **params):
        # the root is the DAG's default (a root its author allows, run_params.check_run_storage_root)
        dag = build_etl_dag(start_date=datetime(2026, 1, 1, tzinfo=UTC),
                            params={"storage_root": str(tmp_path / "root")})
        context = {
            "params": {**DEFAULT_PARAMS, "storage_root": str(tmp_path / "root"), **params},
            "data_interval_start": datetime(2026, 1, 1, tzinfo=UTC),
            "data_interval_end": datetime(2026, 1, 1, 1, tzinfo=UTC),
        }
        return dag.get_task("plan").python_callable(**context)

    return call


@pytest.mark.parametrize("value", ["*", "../..", "/etc", "a.b", "a b", "a\x00b"])
def test_hostile_owner_params_never_reach_a_subject_or_path(value, plan_callable, tmp_path, unreachable_conn):
    """Today the plan step passes owners through and every fetch task rejects them (below)."""
    with pytest.raises(ValueError) as err:
        planned = plan_callable(tmp_path, owners=[value], event_types=["devicesregistered"])
        for group in planned["fetch_ranges"]:
            run_op(storage_root=planned["storage_root"], **group)
    assert named(value) in str(err.value)
    assert [p for p in tree(tmp_path) if not p.startswith("root")] == []  # nothing outside the root
    assert not any("staging" in p or "owner_id=" in p for p in tree(tmp_path))  # no batch folder at all


@pytest.mark.parametrize("field,value", [("owners", ["*"]), ("owners", ["../x"]), ("event_types", ["a.b"]),
                                         ("owners", "*")])
def test_plan_step_rejects_hostile_params_itself(field, value, plan_callable, tmp_path):
    with pytest.raises(ValueError):
        plan_callable(tmp_path, **{field: value})


# ---------------------------------------------------------------------------------------------
# the staging writer and reader


@pytest.mark.parametrize("field", ["owner_id", "event_type", "interval_id", "stream"])
@pytest.mark.parametrize("value", PATH_HOSTILE)
def test_staging_writer_rejects_hostile_path_values_and_writes_nothing(field, value, tmp_path):
    from airflow_provider_plgd.fetch.stager import Stager

    root = tmp_path / "root"
    kwargs = {"stream": "EVENTS", "owner_id": OWNER, "event_type": "devicesregistered",
              "interval_id": "seq-000000000001-000000000002", field: value}
    with pytest.raises(ValueError) as err:
        table = staging.table_uri(Layout.of(str(root)), kwargs["stream"])
        stager = Stager(stream=kwargs["stream"], spill_dir=None)
        stager.add(kwargs["owner_id"], kwargs["event_type"],
                   [(1, "plgd.owners.x.registrations.devicesregistered", 1, None, b"x")])
        records = stager.write(table, kwargs["interval_id"], staging.batch_file_prefix(kwargs["owner_id"], "w1"))
        staging_commits.commit_batches(Layout.of(str(root)), kwargs["stream"], kwargs["interval_id"], kwargs["owner_id"],
                               [kwargs["event_type"]], records, 1)
    assert field in str(err.value) and named(value) in str(err.value)
    assert tree(tmp_path) == []


@pytest.mark.parametrize("value", ["*", "?", "[ab]", "..", "a/b", "."])
def test_staging_readers_reject_glob_and_path_values(value, tmp_path):
    root = tmp_path / "root"
    for call in (lambda: staging.table_uri(Layout.of(str(root)), value), lambda: staging.partition_folder(value, "x"),
                 lambda: staging.partition_folder("i", value), lambda: staging_commits.begin_interval(Layout.of(str(root)), "EVENTS", value, 1),
                 lambda: staging.batch_file_prefix(value, "w")):
        with pytest.raises(ValueError) as err:
            call()
        assert repr(value) in str(err.value)
    assert tree(tmp_path) == []


def test_valid_values_still_build_the_documented_layout(tmp_path):
    root = tmp_path / "root"
    table = staging.table_uri(Layout.of(str(root)), "EVENTS")
    folder = f"{table}/{staging.partition_folder('seq-000000000001-000000000002', 'devicesregistered')}"
    assert folder == f"{root}/staging/EVENTS/interval_id=seq-000000000001-000000000002/event_type=devicesregistered"
    assert os.path.commonpath([folder, str(root)]) == str(root)


# ---------------------------------------------------------------------------------------------
# connection secrets: names Airflow redacts, no credentials in server URLs, no ws:// under TLS
# (the browser test tests/integration/test_connection_ui.py shows the UI side)

URL_SECRET = "urlpw-Qm7Tz41"


def conn_of(**fields):
    base = {"conn_id": "c", "host": None, "port": None, "login": None, "password": None, "extra_dejson": {}}
    return SimpleNamespace(**{**base, **fields})


def _should_hide():
    try:  # Airflow 3
        from airflow._shared.secrets_masker import should_hide_value_for_key
    except ImportError:  # Airflow 2.11
        from airflow.utils.log.secrets_masker import should_hide_value_for_key
    return should_hide_value_for_key


def test_every_secret_extra_has_a_name_airflow_redacts():
    """Airflow's UI and REST API redact an extra only by its name (``should_hide_value_for_key``:
    a word of ``DEFAULT_SENSITIVE_FIELDS`` inside the name), never by the field's
    ``format: password``. Every secret field of ``conn-fields`` -- plain, and with the
    ``extra__plgd_jetstream__`` prefix of the Airflow < 3.2 form -- must be such a name."""
    from airflow_provider_plgd.jetstream.connection import CONN_FIELDS, NKEY_SEED_EXTRA

    should_hide = _should_hide()
    secret = sorted(n for n, spec in CONN_FIELDS.items() if spec["schema"].get("format") == "password")
    assert secret == sorted(["token", NKEY_SEED_EXTRA])
    for name in secret:
        assert should_hide(name) and should_hide(f"extra__plgd_jetstream__{name}"), name
    # the paths and the server list stay readable in the UI
    for name in ("servers", "stream", "creds_file", "tls_ca", "tls_cert", "tls_key", "storage_root"):
        assert not should_hide(name), name


def test_rest_api_response_model_redacts_every_secret_of_the_connection():
    """The REST API's own serializer (``ConnectionResponse``, what ``GET /api/v2/connections/{id}``
    and the UI's edit dialog get) applied to a connection filled the documented way."""
    pytest.importorskip("airflow.api_fastapi.core_api.datamodels.connections")
    from airflow.api_fastapi.core_api.datamodels.connections import ConnectionResponse
    from airflow.models import Connection

    from airflow_provider_plgd.jetstream.connection import NKEY_SEED_EXTRA

    secrets = {"password": "pw-Lk29sQx", "token": "tok-Pq83vNm", "seed": "SUAGJ3XQ" + "A" * 50}
    conn = Connection(conn_id="plgd_ui", conn_type="plgd_jetstream", login="etl", password=secrets["password"],
                      extra=json.dumps({"servers": "nats://nats-1:4222", "token": secrets["token"],
                                        NKEY_SEED_EXTRA: secrets["seed"], "tls_ca": "/etc/plgd/ca.pem"}))
    body = ConnectionResponse.model_validate(conn).model_dump_json()
    for value in secrets.values():
        assert value not in body
    extra = json.loads(json.loads(body)["extra"])
    assert extra == {"servers": "nats://nats-1:4222", "token": "***", NKEY_SEED_EXTRA: "***",
                     "tls_ca": "/etc/plgd/ca.pem"}


@pytest.mark.parametrize("url", [
    f"nats://etl:{URL_SECRET}@127.0.0.1:4222",
    f"tls://etl:{URL_SECRET}@nats-1",
    f"ws://etl:{URL_SECRET}@127.0.0.1:8080",
    f"nats://{URL_SECRET}@127.0.0.1:4222",  # token@host
    f"nats://etl:{URL_SECRET}/x#y@127.0.0.1:4222",  # URL delimiters inside the password
    f"etl:{URL_SECRET}@127.0.0.1:4222",  # no scheme
])
def test_credentials_inside_a_server_url_are_refused_without_showing_them(url):
    """Airflow shows the Host field and the ``servers`` extra in clear text (UI, REST API), so a
    password or token inside a URL would be shown to every UI user: refused, pointing to
    Login/Password and ``token``; only the part after the last ``@`` is quoted."""
    from airflow_provider_plgd.jetstream.connection import settings_from_connection

    for conn in (conn_of(extra_dejson={"servers": f"nats://ok:4222,{url}"}), conn_of(host=url)):
        with pytest.raises(ValueError) as err:
            settings_from_connection(conn)
        text = str(err.value)
        assert URL_SECRET not in text and "etl" not in text
        assert "connection 'c': server URL '" in text and "User and Password fields" in text and "Token ('token')" in text


def test_ws_servers_under_tls_settings_are_refused_and_wss_is_accepted():
    """nats-py never switches a ``ws://`` connection to TLS: with TLS configured it would send
    CONNECT (user, password, token) in clear text."""
    from airflow_provider_plgd.jetstream.connection import settings_from_connection

    for extra in ({"servers": "ws://127.0.0.1:8080", "tls_ca": "/ca.pem"},
                  {"servers": "ws://127.0.0.1:8080", "tls_cert": "/c.pem", "tls_key": "/k.pem"},
                  {"servers": "tls://nats-1:4222,ws://127.0.0.1:8080"},
                  {"servers": "wss://nats-1:443,ws://127.0.0.1:8080"}):
        with pytest.raises(ValueError) as err:
            settings_from_connection(conn_of(extra_dejson=extra))
        assert "server ws://127.0.0.1:8080 is a plain websocket (ws://) but TLS is configured" in str(err.value)
        assert "use wss://" in str(err.value)
    plain = settings_from_connection(conn_of(extra_dejson={"servers": "ws://127.0.0.1:8080"}))
    assert plain.servers == ("ws://127.0.0.1:8080",)
    tls = settings_from_connection(conn_of(extra_dejson={"servers": "wss://nats-1:443, wss://nats-2",
                                                         "tls_ca": "/ca.pem"}))
    assert tls.servers == ("wss://nats-1:443", "wss://nats-2")


def test_former_nkey_seed_extra_is_still_read_with_a_warning(caplog):
    import logging

    from airflow_provider_plgd.jetstream.connection import settings_from_connection

    seed = "SUAGJ3XQ" + "B" * 50
    caplog.set_level(logging.WARNING)
    for key in ("nkey_seed", "extra__plgd_jetstream__nkey_seed"):
        settings = settings_from_connection(conn_of(host="127.0.0.1", extra_dejson={key: seed}))
        assert settings.nkey_seed == seed and seed in settings.secret_values()
    assert "rename the extra to 'nkey_seed_secret'" in caplog.text and seed not in caplog.text
    new = settings_from_connection(conn_of(host="127.0.0.1", extra_dejson={"nkey_seed_secret": seed}))
    assert new.nkey_seed == seed
    with pytest.raises(ValueError, match="set the NKEY seed once, in 'nkey_seed_secret'"):
        settings_from_connection(conn_of(host="127.0.0.1", extra_dejson={"nkey_seed_secret": seed, "nkey_seed": seed}))
    with pytest.raises(ValueError, match=re.escape("set either NKEY seed ('nkey_seed_secret') or Credentials file ('creds_file'), not both")):
        settings_from_connection(conn_of(host="127.0.0.1", extra_dejson={"nkey_seed": seed, "creds_file": "/x"}))


def test_the_operators_storage_root_and_its_deprecated_former_name(tmp_path):
    from airflow_provider_plgd.operators.jetstream_to_staging import JetStreamToStagingOperator

    op = JetStreamToStagingOperator(task_id="a", storage_root=f"file://{tmp_path}//x/")
    assert op._layout({"params": {}}).root == f"{tmp_path}/x"  # normalised once, where it enters
    from airflow.exceptions import AirflowProviderDeprecationWarning

    with pytest.warns(AirflowProviderDeprecationWarning, match="use storage_root"):
        old = JetStreamToStagingOperator(task_id="b", destination=str(tmp_path))
    assert old.storage_root == str(tmp_path) and "storage_root" in old.template_fields
    with pytest.raises(ValueError, match="give storage_root only"):
        JetStreamToStagingOperator(task_id="c", storage_root=str(tmp_path), destination=str(tmp_path))
