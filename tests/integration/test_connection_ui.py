"""The plgd JetStream connection in the real Airflow 3 UI, driven by a headless browser: no secret
of the connection is ever shown.

One real ``airflow api-server`` for the module's tests (Airflow 3, ``SimpleAuthManager`` with
``simple_auth_manager_all_admins``: every visitor is an admin, no login form) runs on a free
loopback port with a PostgreSQL metadata DB (a copy of the session's template that a real ``airflow
db migrate`` migrated) in a temporary ``AIRFLOW_HOME``, and the provider of this
repository on its ``PYTHONPATH``. Playwright for Python drives Debian's ``/usr/bin/chromium``
(never a downloaded browser; ``.ci/run`` installs the package). The first test

1. opens Admin > Connections, "Add Connection", picks the "plgd JetStream" type, fills Login,
   Password and the extra fields Servers, Token and NKEY seed, and saves;
2. reopens the connection ("Edit Connection"), unfolds "Extra Fields" and "Extra Fields JSON", and
   requires that no secret is in the page HTML, in any input's value or in the JSON editor's text
   (they show ``***``), while the servers stay readable;
3. requires the same of ``GET /api/v2/connections/{id}`` and ``GET /api/v2/connections``;
4. saves the reopened form unchanged and reads the metadata DB: the stored connection still holds
   the real secrets (Airflow merges ``***`` back), so the redaction is not a lost value;
5. control: the former extra name ``nkey_seed`` (created through the REST API) comes back in clear
   text -- what the rename to ``nkey_seed_secret`` fixes.

Screenshots of each step are kept in ``tests/artifacts/connection_ui/`` (ignored by git).

The second test puts ``dags/plgd_events_etl.py`` in front of the same api-server: the
DAG's docs panel, the Trigger form's param descriptions, and, after a real run of one interval
(``airflow dags test`` into the api-server's metadata DB; real nats-server and spark-submit), the
asset page with the asset event's ``extra``. Screenshots in ``tests/artifacts/etl_dag_ui/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_plgd.jetstream.connection import NKEY_SEED_EXTRA
from plgd_devtools.nats_server import free_port, new_nkey
from plgd_devtools.postgres_server import Database
from plgd_devtools.spark import spark_lock
from tests.integration.browser import Screenshots

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "tests" / "artifacts" / "connection_ui"
CONN_ID = "plgd_ui_secrets"
#: Seconds to wait for ``airflow db migrate`` and for the api-server to answer.
STARTUP_TIMEOUT_S = 300
#: Milliseconds Playwright waits for one page element.
UI_TIMEOUT_MS = 60_000

pytestmark = [
    pytest.mark.airflow,
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK),
                       reason=f"{CHROMIUM} missing: install Debian's chromium (apt-get install -y chromium; .ci/run does)"),
]
pytest.importorskip("airflow.sdk", reason="the React connection form and /api/v2 are Airflow 3")


class ApiServer:
    """``airflow api-server`` of a temporary ``AIRFLOW_HOME`` in its own process group, on
    ``database``: a migrated PostgreSQL database of the session's server (fixture
    ``airflow_postgres_db``, or :func:`new_airflow_db`: a copy of the template a real
    ``airflow db migrate`` migrated once per session), read back with :meth:`query`."""

    def __init__(self, home: Path, database: Database) -> None:
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.database = database
        from cryptography.fernet import Fernet

        self.fernet_key = Fernet.generate_key().decode()
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env.update({
            "PATH": str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""),
            "PYTHONPATH": str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            **database.airflow_env(),
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            "AIRFLOW__CORE__FERNET_KEY": self.fernet_key,
        })
        self.env = env
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        """Start the api-server (no ``airflow db migrate``: the database is migrated) and wait
        until it answers its health check."""
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start the api-server's process; :meth:`wait_ready` waits until it answers."""
        log = (self.home / "api-server.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "airflow", "api-server", "--host", "127.0.0.1", "--port", str(self.port),
             "--workers", "1"],
            env=self.env, cwd=self.home, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def wait_ready(self) -> None:
        """Wait until the launched api-server answers its health check; fail with its log."""
        assert self.proc is not None, "launch() the api-server first"
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"api-server exited with {self.proc.returncode}:\n{self.log_tail()}"
            try:
                with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        pytest.fail(f"api-server not answering after {STARTUP_TIMEOUT_S} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass

    def log_tail(self, lines: int = 60) -> str:
        path = self.home / "api-server.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def query(self, sql: str, *params: Any) -> list[tuple]:
        """The rows of one SELECT on the metadata database (``%s`` parameters)."""
        return self.database.query(sql, *params)

    def stored_connection(self, conn_id: str) -> dict:
        """The connection row as stored in the metadata DB, decrypted with our Fernet key."""
        from cryptography.fernet import Fernet

        (login, password, extra, pw_enc, extra_enc), = self.query(
            "SELECT login, password, extra, is_encrypted, is_extra_encrypted FROM connection WHERE conn_id = %s",
            conn_id)
        fernet = Fernet(self.fernet_key.encode())
        password = fernet.decrypt(password.encode()).decode() if pw_enc else password
        extra = fernet.decrypt(extra.encode()).decode() if extra_enc else extra
        return {"login": login, "password": password, "extra": json.loads(extra)}


@pytest.fixture(scope="module")
def api_server(tmp_path_factory, postgres_server, airflow_template_db):
    """One api-server for this module's tests (each test its own connection IDs and DAG): the
    ETL DAG's test adds its DAG folder and settings to its own ``airflow dags test`` call only."""
    home = tmp_path_factory.mktemp("airflow")
    server = ApiServer(home, postgres_server.create_database(template=airflow_template_db))
    try:
        with spark_lock():  # a real Airflow component starting on the shared 2-core CI machine
            server.start()
        yield server
    finally:
        server.stop()


def test_connection_secrets_never_shown_in_ui_or_rest_api(api_server):
    from playwright.sync_api import sync_playwright

    t0 = time.monotonic()
    password = f"pw-{secrets.token_hex(6)}"
    token = f"tok-{secrets.token_hex(6)}"
    seed, _public = new_nkey("user")
    servers = "nats://nats-1.example.internal:4222,nats://nats-2.example.internal:4222"
    leaks = {"password": password, "token": token, "nkey seed": seed}
    shot = Screenshots(ARTIFACTS)
    steps = shot.paths

    def assert_no_secret(text: str, where: str) -> None:
        for what, value in leaks.items():
            assert value not in text, f"the {what} is shown in {where}"

    with spark_lock(), sync_playwright() as pw:  # the api-server and Chromium on the shared 2-core machine
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1400})
            page.set_default_timeout(UI_TIMEOUT_MS)
            # 1. add the connection through the form
            page.goto(f"{api_server.url}/connections", wait_until="networkidle")
            page.get_by_role("button", name="Add Connection").click()
            dialog = page.get_by_role("dialog")
            dialog.locator("input[name=connection_id]").fill(CONN_ID)
            kind = dialog.get_by_role("combobox")
            kind.click()
            kind.fill("plgd")
            page.get_by_role("option", name="plgd JetStream").click()
            dialog.locator("input[name=login]").fill("etl")
            dialog.locator("input[name=password]").fill(password)
            dialog.get_by_role("button", name="Extra Fields", exact=True).click()
            dialog.locator("#element_servers").fill(servers)
            dialog.locator("#element_token").fill(token)
            dialog.locator(f"#element_{NKEY_SEED_EXTRA}").fill(seed)
            # the secrets are typed into password inputs (format: password), the servers stay readable
            types = {name: dialog.locator(f"#element_{name}").evaluate("e => e.type")
                     for name in ("servers", "token", NKEY_SEED_EXTRA)}
            assert types == {"servers": "text", "token": "password", NKEY_SEED_EXTRA: "password"}, types
            shot(page, "add-form-filled")
            dialog.get_by_role("button", name="Save").click()
            dialog.wait_for(state="hidden")
            page.get_by_text(CONN_ID).wait_for()
            shot(page, "list-after-save")
            assert_no_secret(page.content(), "the connection list")

            # 2. reopen it: the form, the extra fields and the Extra Fields JSON editor
            def reopen():
                page.goto(f"{api_server.url}/connections", wait_until="networkidle")
                page.get_by_role("button", name="Edit Connection").first.click()
                edit = page.get_by_role("dialog")
                edit.locator("input[name=connection_id]").wait_for()
                edit.get_by_role("button", name="Extra Fields", exact=True).click()
                edit.locator(f"#element_{NKEY_SEED_EXTRA}").wait_for(state="visible")
                shot(page, "reopened-extra-fields")
                edit.get_by_role("button", name="Extra Fields JSON").click()
                edit.locator(".view-lines").wait_for()
                edit.get_by_text('"servers"').wait_for()
                return edit

            edit = reopen()
            shot(page, "reopened-extra-fields-json")
            assert edit.locator("input[name=connection_id]").input_value() == CONN_ID
            values = {name: edit.locator(f"[name={name}]").input_value()
                      for name in ("login", "password", "element_servers", "element_token",
                                   f"element_{NKEY_SEED_EXTRA}")}
            assert values == {"login": "etl", "password": "***", "element_servers": servers, "element_token": "***",
                              f"element_{NKEY_SEED_EXTRA}": "***"}
            editor = edit.locator(".view-lines").inner_text().replace("\u00a0", " ")
            assert f'"{NKEY_SEED_EXTRA}": "***"' in editor and '"token": "***"' in editor, editor
            all_values = [el.input_value() for el in edit.locator("input, textarea").all()]
            for where, text in (("the page HTML", page.content()), ("the Extra Fields JSON editor", editor),
                                ("an input of the form", "\n".join(all_values))):
                assert_no_secret(text, where)

            # 3. the REST API the UI reads
            one = page.request.get(f"{api_server.url}/api/v2/connections/{CONN_ID}")
            listing = page.request.get(f"{api_server.url}/api/v2/connections")
            assert one.status == 200 and listing.status == 200
            for where, response in (("GET /api/v2/connections/{id}", one), ("GET /api/v2/connections", listing)):
                assert_no_secret(response.text(), where)
            body = one.json()
            assert body["password"] == "***" and body["login"] == "etl"
            extra = json.loads(body["extra"])
            assert extra["token"] == "***" and extra[NKEY_SEED_EXTRA] == "***" and extra["servers"] == servers

            # 4. save the reopened form unchanged: the stored secrets survive (Airflow merges '***' back)
            edit.get_by_role("button", name="Save").click()
            edit.wait_for(state="hidden")
            shot(page, "saved-again")
            stored = api_server.stored_connection(CONN_ID)
            assert stored["password"] == password
            assert stored["extra"]["token"] == token and stored["extra"][NKEY_SEED_EXTRA] == seed
            assert stored["extra"]["servers"] == servers
            edit = reopen()
            shot(page, "reopened-after-second-save")
            assert_no_secret(page.content() + edit.locator(".view-lines").inner_text(), "the reopened form")

            # 5. control: the former extra name is not one Airflow redacts
            legacy = page.request.post(f"{api_server.url}/api/v2/connections", data={
                "connection_id": "plgd_ui_legacy", "conn_type": "plgd_jetstream",
                "extra": json.dumps({"servers": "nats://nats-1.example.internal:4222", "nkey_seed": seed})})
            assert legacy.status == 201, legacy.text()
            shown = page.request.get(f"{api_server.url}/api/v2/connections/plgd_ui_legacy").json()
            assert json.loads(shown["extra"])["nkey_seed"] == seed
        finally:
            browser.close()
    print(f"\nconnection UI test: {time.monotonic() - t0:.1f} s in the browser; screenshots:\n  "
          + "\n  ".join(steps))


# ---------------------------------------------------------------------------------------------
# The ETL DAG in the UI: docs panel, trigger form, asset event metadata after a run
# ---------------------------------------------------------------------------------------------
ETL_DAG_ID = "plgd_events_etl"
ETL_ARTIFACTS = REPO / "tests" / "artifacts" / "etl_dag_ui"
#: Interval length (s) of the ETL DAG in this test (``PLGD_ETL_SCHEDULE_SECONDS``).
ETL_INTERVAL_S = 8
#: Seconds ``airflow dags test`` may take for one interval (three spark-submits).
DAGS_TEST_TIMEOUT_S = 600


def _dag_file_docs() -> str:
    """The user docs of ``dags/plgd_events_etl.py`` (its module docstring, Markdown)."""
    import ast

    return ast.get_docstring(ast.parse((REPO / "dags" / "plgd_events_etl.py").read_text()))


def _airflow(server: ApiServer, *args: str, env: dict[str, str], timeout: float = STARTUP_TIMEOUT_S) -> str:
    done = subprocess.run([sys.executable, "-m", "airflow", *args], env=env, cwd=server.home,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"airflow {' '.join(args)}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def test_etl_dag_docs_params_and_asset_event_metadata_in_the_ui(tmp_path, jetstream, spark_connect_server,
                                                                api_server):
    """The ETL DAG of ``dags/`` in the real UI: the docs panel renders the DAG file's user docs,
    the Trigger form shows every param's description, and after a real run (``airflow dags test``:
    real nats-server, the Spark tasks on the session's real Spark Connect server
    (``PLGD_ETL_SPARK_CONNECT_CONN_ID``: this test proves the UI, not ``spark-submit``;
    docs/testing.md), the api-server's metadata DB) the asset page shows the asset event's
    ``extra`` (interval ID, counts, snapshot version). Screenshots in ``tests/artifacts/etl_dag_ui/``."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
    from playwright.sync_api import sync_playwright

    from airflow_provider_plgd import times
    from airflow_provider_plgd.etl import param_schemas
    from airflow_provider_plgd.simulator import SimulationConfig, generate, publish
    from tests.integration.conftest import spark_connect_conn

    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copy(REPO / "dags" / "plgd_events_etl.py", dags)
    storage_root = tmp_path / "root"
    storage_root.mkdir()
    server = api_server  # the module's api-server; the run's settings go to `airflow dags test` alone
    env = dict(server.env)
    env.update({
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "PLGD_ETL_SCHEDULE_SECONDS": str(ETL_INTERVAL_S),
        "PLGD_ETL_CATCHUP": "false",
        "PLGD_ETL_SPARK_CONNECT_CONN_ID": "plgd_spark_connect_test",
        **spark_connect_conn(spark_connect_server, conn_id="plgd_spark_connect_test"),
        "PLGD_ETL_STORAGE_ROOTS": json.dumps([str(storage_root)]),  # the root this run chooses
        "AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT": os.environ["AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT"],
    })
    for key in ("PLGD_ETL_SPARK_CONF", "SPARK_REMOTE", "SPARK_CONNECT_AUTHENTICATE_TOKEN"):
        env.pop(key, None)
    shot = Screenshots(ETL_ARTIFACTS)
    steps = shot.paths

    t0 = time.monotonic()
    # one interval of the schedule (start date 2026-01-01, 8 s) with a small simulation in it, published
    # in real time (no Spark slot held while waiting for the interval's end)
    start_s = (int(time.time() // ETL_INTERVAL_S) + 1) * ETL_INTERVAL_S
    sim = generate(SimulationConfig(seed=11, owners=1, devices_per_owner=1, resources_per_device=1,
                                    intervals=1, steps_per_interval=8, interval_seconds=ETL_INTERVAL_S,
                                    start_time_ns=int(start_s * 1e9)))
    publish(sim, servers=[jetstream.url], stream="EVENTS", wait_for_intervals=True)
    end_s = start_s + ETL_INTERVAL_S
    time.sleep(max(0.0, end_s + 0.5 - time.time()))
    end = datetime.fromtimestamp(end_s, tz=timezone.utc)
    interval_id = times.interval_id(datetime.fromtimestamp(start_s, tz=timezone.utc), end)
    with spark_lock():  # the api-server, the Spark tasks and Chromium on the shared 2-core machine
        # no `airflow dags reserialize` (~4 s of CLI start): `airflow dags test` writes the DAG to the DB
        _airflow(server, "dags", "test", ETL_DAG_ID, end.isoformat(), "-c",
                 json.dumps({"storage_root": str(storage_root), "settle_seconds": 0}),
                 env=env, timeout=DAGS_TEST_TIMEOUT_S)
        run_s = time.monotonic() - t0

        with sync_playwright() as pw:  # after the publishing above: Playwright's sync API holds an event loop
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1400})
                page.set_default_timeout(UI_TIMEOUT_MS)
                # the asset events of the run, as the REST API the UI reads holds them
                events = page.request.get(f"{server.url}/api/v2/assets/events",
                                          params={"source_dag_id": ETL_DAG_ID, "limit": 100}).json()
                extras = {e["name"]: e["extra"] for e in events["asset_events"]}
                snapshot_extra = extras[f"{ETL_DAG_ID}.snapshots"]
                assert snapshot_extra["interval_id"] == interval_id, extras
                assert snapshot_extra["snapshot_version"] and sum(snapshot_extra["rows"].values()) > 0, extras
                assert extras[f"{ETL_DAG_ID}.staging"]["messages"] == len(sim.messages), extras

                # 1. the docs panel renders the DAG file's user docs
                page.goto(f"{server.url}/dags/{ETL_DAG_ID}", wait_until="networkidle")
                shot(page, "dag")
                page.get_by_test_id("markdown-button").click()
                docs = page.get_by_role("dialog")
                docs.get_by_text("Manual runs.").wait_for()
                page.wait_for_timeout(1000)  # the dialog fades in: screenshot it opaque
                shot(page, "docs-panel")
                text = docs.inner_text()
                assert ETL_DAG_ID in text and ":func:" not in text, text[:500]
                for line in ("waits until the interval is complete", "PLGD_ETL_SCHEDULE_SECONDS",
                             "Manual runs."):
                    assert line in text, f"{line!r} not in the docs panel: {text[:1500]}"
                cells = [c for c in ("wait_for_interval", "plan", "fetch_ranges", "spark_needed", "summary")
                         if docs.get_by_role("cell", name=c, exact=True).count()]
                assert len(cells) == 5, cells  # the task table is rendered as a table
                page.keyboard.press("Escape")
                docs.wait_for(state="hidden")

                # 2. the Trigger form: every param with its title and description
                page.get_by_role("button", name="Trigger").first.click()
                form = page.get_by_role("dialog")
                form.get_by_text("Run Parameters").wait_for()
                page.wait_for_timeout(1000)
                shot(page, "trigger-form")
                text = form.inner_text()
                for name, schema in param_schemas().items():
                    assert schema["title"] in text and schema["description"] in text, (name, text[:3000])
                page.keyboard.press("Escape")
                form.wait_for(state="hidden")

                # 3. the asset page: the run's event with its extra
                asset = page.request.get(f"{server.url}/api/v2/assets",
                                         params={"name_pattern": f"{ETL_DAG_ID}.snapshots"}).json()["assets"]
                assert len(asset) == 1, asset
                page.goto(f"{server.url}/assets/{asset[0]['id']}", wait_until="networkidle")
                page.get_by_text("1 Asset Event").wait_for()
                expected = [f'"interval_id": "{interval_id}"',
                            f'"snapshot_version": {json.dumps(snapshot_extra["snapshot_version"])}',
                            *(f'"{table}": {count}' for table, count in snapshot_extra["rows"].items())]
                folded = page.locator(".codicon-folding-collapsed, .codicon-folding-manual-collapsed")
                # the extra is shown folded, and its nested objects; on a busy machine the editor folds a
                # moment after it rendered: unfold whatever is folded until every expected line shows
                shown = ""
                deadline = time.monotonic() + UI_TIMEOUT_MS / 1000
                while time.monotonic() < deadline:
                    if folded.count():
                        with contextlib.suppress(PlaywrightTimeoutError):  # the marker went meanwhile
                            folded.first.click(force=True, timeout=5000)
                    else:
                        shown = " ".join("\n".join(page.locator(".view-lines").all_inner_texts()).split())
                        if all(value in shown for value in expected):
                            break
                    page.wait_for_timeout(500)  # the editor re-renders the unfolded lines
                assert folded.count() == 0, "the asset event's extra stays folded"
                shot(page, "asset-event-extra")
                for value in expected:
                    assert value in shown, (value, shown)
            finally:
                browser.close()
    print(f"\nETL DAG UI test: {time.monotonic() - t0:.1f} s ({run_s:.1f} s until the run finished); "
          "screenshots:\n  " + "\n  ".join(steps))
