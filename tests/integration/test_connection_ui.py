"""The plgd JetStream connection in the real Airflow 3 UI, driven by a headless browser: no secret
of the connection is ever shown (security issue #14).

A real ``airflow api-server`` (Airflow 3, ``SimpleAuthManager`` with
``simple_auth_manager_all_admins``: every visitor is an admin, no login form) runs on a free
loopback port with a SQLite metadata DB in a temporary ``AIRFLOW_HOME``, and the provider of this
repository on its ``PYTHONPATH``. Playwright for Python drives Debian's ``/usr/bin/chromium``
(never a downloaded browser; ``.ci/run`` installs the package). The test

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
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from airflow_provider_plgd.get_provider_info import NKEY_SEED_EXTRA
from plgd_devtools.nats_server import free_port, new_nkey
from plgd_devtools.spark import spark_lock

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
    """``airflow api-server`` of a temporary ``AIRFLOW_HOME`` in its own process group."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.db = home / "airflow.db"
        from cryptography.fernet import Fernet

        self.fernet_key = Fernet.generate_key().decode()
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env.update({
            "PATH": str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""),
            "PYTHONPATH": str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.db}",
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            "AIRFLOW__CORE__FERNET_KEY": self.fernet_key,
        })
        self.env = env
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        migrate = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=self.env, cwd=self.home,
                                 capture_output=True, text=True, timeout=STARTUP_TIMEOUT_S)
        assert migrate.returncode == 0, migrate.stdout[-3000:] + migrate.stderr[-3000:]
        log = (self.home / "api-server.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "airflow", "api-server", "--host", "127.0.0.1", "--port", str(self.port),
             "--workers", "1"],
            env=self.env, cwd=self.home, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"api-server exited with {self.proc.returncode}:\n{self.log_tail()}"
            try:
                with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1)
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

    def stored_connection(self, conn_id: str) -> dict:
        """The connection row as stored in the metadata DB, decrypted with our Fernet key."""
        from cryptography.fernet import Fernet

        con = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=30)
        try:
            login, password, extra, pw_enc, extra_enc = con.execute(
                "SELECT login, password, extra, is_encrypted, is_extra_encrypted FROM connection WHERE conn_id = ?",
                (conn_id,)).fetchone()
        finally:
            con.close()
        fernet = Fernet(self.fernet_key.encode())
        password = fernet.decrypt(password.encode()).decode() if pw_enc else password
        extra = fernet.decrypt(extra.encode()).decode() if extra_enc else extra
        return {"login": login, "password": password, "extra": json.loads(extra)}


@pytest.fixture
def api_server(tmp_path):
    home = tmp_path / "airflow"
    home.mkdir()
    server = ApiServer(home)
    with spark_lock():  # a real Airflow component on the shared 2-core CI machine
        try:
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
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    steps: list[str] = []

    def shot(page, name: str) -> None:
        path = ARTIFACTS / f"{len(steps) + 1:02d}-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        steps.append(str(path))

    def assert_no_secret(text: str, where: str) -> None:
        for what, value in leaks.items():
            assert value not in text, f"the {what} is shown in {where}"

    with sync_playwright() as pw:
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
