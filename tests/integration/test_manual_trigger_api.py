"""The UI's Trigger dialog, in a browser against a real Airflow 3 api-server, scheduler and
dag-processor on PostgreSQL (``AirflowStack`` of ``test_backfill.py``; the api-server serves the UI,
the public REST API and the execution API). Playwright drives Debian's ``/usr/bin/chromium``.

1. The scheduler runs the DAG's one scheduled interval, an hour before now that the stream holds
   no message for, so its Spark tasks are skipped and its summary reconciles 0 = 0.
2. In the Trigger dialog an owner ID ``a/../b`` is refused by the api-server (400, the param's
   JSON-schema ``pattern``): the dialog shows the reason above the form, a toast "Failed to
   Trigger Dag", and no run is created.
3. The dialog with its defaults (logical date: now) creates a manual run with the default params
   (``POST /api/v2/dags/{dag_id}/dagRuns``). Its data interval ends at now, off the schedule: it
   fails in ``wait_for_interval`` at once, without retries, with ``OffScheduleIntervalError``
   naming the schedule's interval and the backfill to use, and writes nothing.
4. The task's page shows that error in its log without unfolding a log group (not only inside
   the collapsed "Pre Execute" group).

Screenshots in ``tests/artifacts/trigger_form_ui/``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import quote

import pytest

from airflow_provider_plgd.etl import DEFAULT_PARAMS
from airflow_provider_plgd.tables.layout import Layout
from tests.integration.airflow_stack import DAG_ID, REPO, AirflowStack, airflow_env
from tests.integration.test_connection_ui import CHROMIUM, CHROMIUM_ARGS, UI_TIMEOUT_MS

pytestmark = [
    pytest.mark.airflow,
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK),
                       reason=f"{CHROMIUM} missing: install Debian's chromium (apt-get install -y chromium)"),
]


ARTIFACTS = REPO / "tests" / "artifacts" / "trigger_form_ui"


def _shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def _open_trigger_form(page, url: str):
    """Open the DAG page and its Trigger dialog; return the dialog once its Run Parameters show."""
    page.goto(f"{url}/dags/{DAG_ID}", wait_until="networkidle")
    page.get_by_role("button", name="Trigger").first.click()
    form = page.get_by_role("dialog")
    form.get_by_text("Run Parameters").wait_for()
    form.locator("#element_owners").wait_for()
    page.wait_for_timeout(500)  # the dialog fades in: screenshot it opaque
    return form


def test_trigger_dialog_in_a_browser_bad_owner_refused_defaults_run_refused_with_visible_error(jetstream, airflow_postgres_db,
                                                                              tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    t0 = time.monotonic()
    home, dags, root = tmp_path / "airflow", tmp_path / "dags", tmp_path / "data"
    for path in (home, dags, root):
        path.mkdir()
    shutil.copy(REPO / "dags" / "plgd_events_etl.py", dags / "plgd_events_etl.py")
    hour = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    env = airflow_env(home=home, dags=dags, root=root, nats_server=jetstream, start=hour - timedelta(hours=1),
                      database=airflow_postgres_db.airflow_env())
    env.update({"PLGD_ETL_SCHEDULE_SECONDS": "3600", "PLGD_ETL_END_DATE": ""})
    # the api-server serves the UI and the public REST API too
    stack = AirflowStack(home=home, env=env, db_url=airflow_postgres_db.url, api_apps="core,execution")
    url = env["AIRFLOW__API__BASE_URL"]
    try:
        stack.start(("scheduler", "dag-processor", "api-server"))

        # 1. The scheduled interval [hour - 1 h, hour): empty, so no Spark; the chain reconciles 0 = 0.
        runs = stack.wait_for_runs(count=1, what="the scheduled empty interval", timeout=300,
                                   done=lambda rs: rs[0][1] == "success")
        tis = dict(stack.query("SELECT task_id, state FROM task_instance WHERE dag_id = %s AND run_id = %s "
                               "AND map_index IN (-1, 0)", DAG_ID, runs[0][0]))
        # the stream holds no message at all: one fetch task records the empty range, the Spark tasks are skipped
        assert {t: tis[t] for t in ("fetch", "spark_needed", "decode", "dedupe", "rebuild", "summary")} == {
            "fetch": "success", "spark_needed": "success", "decode": "skipped", "dedupe": "skipped",
            "rebuild": "skipped", "summary": "success"}, tis
        from airflow_provider_plgd import times
        from airflow_provider_plgd.tables import ledger

        interval = times.interval_id(hour - timedelta(hours=1), hour)
        summary = ledger.read_ledger_file(f"{Layout.of(str(root)).ledger_interval_dir('EVENTS', interval)}/summary.json")
        assert summary["reconciled"] is True and summary["chain"]["stream_total"] == 0, summary
        assert summary["chain"]["spark_skipped"], summary
        before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))

        # 2. The Trigger dialog in a browser: a bad owner is refused, the defaults submit a run
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1400})
                page.set_default_timeout(UI_TIMEOUT_MS)
                t_ui = time.monotonic()
                # 2a. an owner ID with '/' and '..' is refused with 400 (the param's JSON-schema pattern)
                form = _open_trigger_form(page, url)
                form.locator("#element_owners").fill("a/../b")
                with page.expect_response(lambda r: r.request.method == "POST"
                                          and r.url.endswith(f"/dags/{DAG_ID}/dagRuns")) as refused:
                    form.get_by_test_id("trigger-dag-submit").click()
                assert refused.value.status == 400, refused.value.text()
                assert "Invalid input for param owners" in refused.value.json()["detail"], refused.value.text()
                page.get_by_text("Failed to Trigger Dag").first.wait_for()  # the toast, and the reason in the dialog:
                form.get_by_text("Invalid input for param owners: 'a/../b' does not match").wait_for()
                form.locator("#element_owners").scroll_into_view_if_needed()  # the field and the toast
                _shot(page, "bad-owner-refused")
                assert len(stack.runs()) == 1  # no run was created

                # 2b. the defaults, as the dialog fills them (logical date: now): a run is created
                form = _open_trigger_form(page, url)
                _shot(page, "trigger-form-defaults")
                with page.expect_response(lambda r: r.request.method == "POST"
                                          and r.url.endswith(f"/dags/{DAG_ID}/dagRuns")) as created:
                    form.get_by_test_id("trigger-dag-submit").click()
                assert created.value.status == 200, created.value.text()
                body = created.value.json()
                run_id = body["dag_run_id"]
                assert body["run_type"] == "manual" and body["triggered_by"] == "ui", body
                assert body["conf"] == {**DEFAULT_PARAMS, **json.loads(env["PLGD_ETL_PARAMS"])}, body["conf"]
                now = datetime.fromisoformat(body["logical_date"].replace("Z", "+00:00"))
                assert body["data_interval_end"] == body["logical_date"], body  # the interval that ends "now"
                assert abs((now - datetime.now(timezone.utc)).total_seconds()) < 300, body
                ui_s = time.monotonic() - t_ui

                state = stack.wait_for_run_end(run_id, timeout=180)
                assert state == [("failed",)], (state, stack.log_tail("scheduler"))
                tis = dict((t, (s, n)) for t, s, n in stack.query(
                    "SELECT task_id, state, try_number FROM task_instance WHERE dag_id = %s AND run_id = %s "
                    "AND map_index = -1", DAG_ID, run_id))
                assert tis["wait_for_interval"] == ("failed", 1) and tis["plan"][0] == "upstream_failed", tis
                text = stack.task_log(run_id, "wait_for_interval")
                grid_end = now.replace(minute=0, second=0, microsecond=0)
                assert "OffScheduleIntervalError" in text and "not an interval of the schedule" in text, text[-2000:]
                assert f"--from-date {(grid_end - timedelta(hours=1)).isoformat()}" in text, text[-2000:]

                # 2c. the task's failure view shows the error without unfolding a log group
                t_ui = time.monotonic()
                page.goto(f"{url}/dags/{DAG_ID}/runs/{quote(run_id)}/tasks/wait_for_interval",
                          wait_until="networkidle")
                page.get_by_text("Task failed with exception").first.wait_for(state="attached")  # the log is in
                page.wait_for_timeout(1000)
                _shot(page, "refused-run-task-failure")
                for line in ("not an interval of the schedule", "nothing was read or written",
                             f"--from-date {(grid_end - timedelta(hours=1)).isoformat()}"):
                    assert page.get_by_text(line).filter(visible=True).count(), f"{line!r} not visible"
                ui_s += time.monotonic() - t_ui
            finally:
                browser.close()
        assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before  # nothing written
    finally:
        stack.stop()
        print(f"[test_manual_trigger_api] {time.monotonic() - t0:.1f} s; screenshots in {ARTIFACTS}")
    print(f"[test_manual_trigger_api] browser steps {ui_s:.1f} s")
