"""The plgd page of the Airflow 3 UI (``airflow_provider_plgd.ui``) against a real api-server,
nats-server and chain, in Chromium; and who may see it.

One api-server (``test_connection_ui.ApiServer``: a migrated PostgreSQL metadata DB, fixture
``airflow_postgres_db``, and a temporary ``AIRFLOW_HOME``) in multi-team mode with ``SimpleAuthManager``: two DAG bundles, ``team_a``
holding the ETL DAG ``plgd_etl_a`` (its root holds the chain below) and ``team_b`` holding
``plgd_etl_b`` (an empty root); the viewers ``alice`` (team_a) and ``bob`` (team_b). The chain
of ``plgd_etl_a`` has seven 8-second intervals, with messages on a real nats-server:

    I0 committed by a whole run of the ETL DAG (``airflow dags test``, its Spark tasks on the
       session's Spark Connect server; one payload that is no plgd event, duplicates) |
    I1 planned by the DAG's ``plan`` task and never committed (``airflow tasks test``: a run that
       stopped after its plan): a hole once a later interval is committed |
    I2, I3 committed (I3: head and snapshot) | I4 unfinished and failed (its summary does not
    reconcile) | I5 never planned | I6 empty

I2..I6 are written as in ``test_status.py`` (the ledger, interval tables without Spark, the
snapshot record): the DAG refuses to plan or build on the hole I1 leaves. I0's run is also the run
whose ``plgd.interval.*`` metrics a StatsD listener catches (``test_metrics_monitor.check_interval_metrics``),
and its row links to that DAG run.

The test checks the JSON API against ground truth read without our code (nats-py, deltalake, the
metadata DB), the
page in Chromium (the nav entry, the iframe, the rows and their states, the pager) and the auth:
bob gets 403 and no data for ``plgd_etl_a``, the list hides it, no token is 401. Screenshots go
to ``tests/artifacts/plgd_ui/`` (ignored by git).

If the installed distribution lacks the ``airflow.plugins`` entry point (a checkout newer than
the editable install), a ``.dist-info`` with only that entry point is put on the api-server's
``PYTHONPATH``, so that Airflow finds the plugin the way it does once installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from importlib.metadata import entry_points
from pathlib import Path
from urllib.parse import quote

import pytest
from deltalake import DeltaTable

from airflow_provider_plgd import times
from airflow_provider_plgd.tables import ledger, storage
from airflow_provider_plgd.tables.layout import Layout
from plgd_devtools import interval_tables
from plgd_devtools.spark import spark_lock
from plgd_devtools.statsd_listener import StatsdListener
from tests.integration.browser import Screenshots
from tests.integration.conftest import publish_messages, read_stream, spark_connect_conn
from tests.integration.test_connection_ui import (
    CHROMIUM,
    CHROMIUM_ARGS,
    DAGS_TEST_TIMEOUT_S,
    UI_TIMEOUT_MS,
    ApiServer,
)
from tests.integration.test_metrics_monitor import check_interval_metrics
from tests.integration.test_status import plan as plan_interval

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "tests" / "artifacts" / "plgd_ui"
USERS = {"alice": "team_a", "bob": "team_b"}

pytestmark = [pytest.mark.airflow]

DAG_FILE = '''
from datetime import datetime, timedelta, timezone
from airflow_provider_plgd.etl import build_etl_dag

dag = build_etl_dag(dag_id={dag_id!r}, schedule=timedelta(seconds={step}), catchup=False,
                    start_date=datetime.fromtimestamp({start}, tz=timezone.utc), default_args={{"retries": 0}},
                    spark_connect_conn_id="plgd_spark_connect_test", params={{"storage_root": {root!r}, "settle_seconds": 0}})
'''
#: ``airflow teams sync`` then ``airflow dags reserialize``: Airflow's own CLI entry point run twice in
#: one Python process, not two (each start of Python and Airflow costs ~3 s CPU).
SYNC_AND_RESERIALIZE = """
import sys
from airflow.__main__ import main
for command in (["teams", "sync"], ["dags", "reserialize"]):
    sys.argv = ["airflow", *command]
    main()
"""
#: Interval length (s) of the ETL DAGs here: the DAG-built intervals' messages are published in real time.
STEP_S = 8


def _entry_point_shim(base: Path) -> str | None:
    """A folder with a ``.dist-info`` declaring the plugin's entry point, or None when installed."""
    if any(ep.value == "airflow_provider_plgd.ui.plugin:PlgdPlugin" for ep in entry_points(group="airflow.plugins")):
        return None
    info = base / "plgd_ui_entry_point-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plgd-ui-entry-point\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[airflow.plugins]\nplgd = airflow_provider_plgd.ui.plugin:PlgdPlugin\n")
    return str(base)


def _chain(root: str, url: str, start_ns: int) -> dict:
    """The chain of the module docstring in hourly intervals, all written by the project's functions
    (no Spark: the monitor test's chain, ``test_metrics_monitor.py``), at ``root``; returns its
    interval IDs and sequence ranges. I0..I4 as the module docstring says, I0 written like I2."""
    from airflow_provider_plgd.simulator import SimulationConfig, generate

    sim = generate(SimulationConfig(seed=5, owners=1, devices_per_owner=2, resources_per_device=1, intervals=7,
                                    steps_per_interval=3, interval_seconds=3600.0, start_time_ns=start_ns))
    ids = interval_tables.interval_ids(sim)
    decoded = interval_tables.decoded_intervals(sim)
    ranges = {}
    for k in (0, 1, 2, 3, 4):
        seqs = publish_messages(url, [(m.subject, m.data, None) for m in sim.messages if m.interval == k])
        ranges[k] = (seqs[0], seqs[-1] + 1)
    tail = publish_messages(url, [(m.subject, m.data, None) for m in sim.messages if m.interval == 5])
    for k in (0, 1, 2, 3, 4):
        plan_interval(root, ids[k], *ranges[k], ranges[k][1] - ranges[k][0])
    plan_interval(root, ids[6], tail[-1] + 1, tail[-1] + 1, 0)
    for k in (0, 2, 3):
        interval_tables.commit_interval_tables(root, ids[k], *decoded[k])
    interval_tables.commit_snapshot_record(root, ids[3], [ids[0], ids[2], ids[3]])
    interval_tables.commit_interval_tables(root, ids[4], *decoded[4], dedupe=False)
    for k, problems in ((0, []), (2, []), (3, []), (4, ["dedupe: no run summary"])):  # what summary wrote
        ledger.write_ledger_file(storage.join_path(Layout.of(root).ledger_interval_dir("EVENTS", ids[k]), "summary.json"),
                                 {"version": ledger.LEDGER_VERSION, "interval_id": ids[k], "stream": "EVENTS",
                                  "chain": {}, "problems": problems, "reconciled": not problems})
    return {"ids": ids, "ranges": ranges}


def _simulation(start_s: int):
    from airflow_provider_plgd.simulator import SimulationConfig, generate

    return generate(SimulationConfig(seed=5, owners=1, devices_per_owner=2, resources_per_device=1, intervals=7,
                                     steps_per_interval=3, interval_seconds=float(STEP_S),
                                     start_time_ns=start_s * 10**9, duplicates=0.2))


def _publish_in_time(url: str, sim, start_s: int) -> None:
    """Publish the messages of I0 and I1 inside their own windows (what the DAG's plan counts by time);
    I0 also gets one payload that is no plgd event (quarantined)."""
    owner = sim.messages[0].subject.split(".")[2]
    for k in (0, 1):
        time.sleep(max(0.0, start_s + k * STEP_S + 0.5 - time.time()))
        bad = [(f"plgd.owners.{owner}.devices.d1.resource-links.resourcelinkspublished", b"\xff not a plgd event",
                None)] if k == 0 else []
        publish_messages(url, [(m.subject, m.data, None) for m in sim.messages if m.interval == k] + bad)


def _dag_chain_tail(root: str, url: str, sim) -> dict:
    """After the DAG built I0 and planned I1: I2..I6 of the module docstring, written by the project's
    own functions (the DAG refuses to build on the hole I1 leaves, so no DAG can commit them)."""
    ids = interval_tables.interval_ids(sim)
    decoded = interval_tables.decoded_intervals(sim)
    ranges = {}
    for k in (2, 3, 4):
        seqs = publish_messages(url, [(m.subject, m.data, None) for m in sim.messages if m.interval == k])
        ranges[k] = (seqs[0], seqs[-1] + 1)
    tail = publish_messages(url, [(m.subject, m.data, None) for m in sim.messages if m.interval == 5])
    for k in (2, 3, 4):
        plan_interval(root, ids[k], *ranges[k], ranges[k][1] - ranges[k][0])
    plan_interval(root, ids[6], tail[-1] + 1, tail[-1] + 1, 0)
    for k in (2, 3):
        interval_tables.commit_interval_tables(root, ids[k], *decoded[k])
    interval_tables.commit_snapshot_record(root, ids[3], [ids[0], ids[2], ids[3]])
    interval_tables.commit_interval_tables(root, ids[4], *decoded[4], dedupe=False)
    for k, problems in ((2, []), (3, []), (4, ["dedupe: no run summary"])):  # what summary wrote
        ledger.write_ledger_file(storage.join_path(Layout.of(root).ledger_interval_dir("EVENTS", ids[k]), "summary.json"),
                                 {"version": ledger.LEDGER_VERSION, "interval_id": ids[k], "stream": "EVENTS",
                                  "chain": {}, "problems": problems, "reconciled": not problems})
    return {"ids": ids, "ranges": ranges}


def _get(url: str, token: str | None) -> tuple[int, dict]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def _token(server: ApiServer, user: str) -> str:
    body = json.dumps({"username": user, "password": f"pw-{user}"}).encode()
    request = urllib.request.Request(f"{server.url}/auth/token", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        return json.loads(resp.read())["access_token"]


def test_plgd_page_shows_the_chain_with_its_hole_and_only_to_readers(tmp_path, jetstream, spark_connect_server,
                                                                      airflow_postgres_db):
    from playwright.sync_api import sync_playwright

    t0 = time.monotonic()
    timings: dict[str, float] = {}
    start_s = (int(time.time()) // STEP_S + 1) * STEP_S  # I0 starts in 0 to 8 s: its messages in its window
    sim = _simulation(start_s)
    ids = interval_tables.interval_ids(sim)
    publisher = threading.Thread(target=_publish_in_time, args=(jetstream.url, sim, start_s), daemon=True)
    publisher.start()
    roots = {"a": tmp_path / "root_a", "b": tmp_path / "root_b"}
    expected = {ids[0]: "committed", ids[1]: "hole", ids[2]: "committed", ids[3]: "committed", ids[4]: "failed",
                ids[5]: "never_planned", ids[6]: "empty"}

    home = tmp_path / "airflow"
    bundles = []
    for team, name in (("team_a", "a"), ("team_b", "b")):
        folder = home / f"dags_{name}"
        folder.mkdir(parents=True)
        (folder / f"plgd_etl_{name}.py").write_text(DAG_FILE.format(dag_id=f"plgd_etl_{name}", start=start_s,
                                                                   step=STEP_S, root=str(roots[name])))
        bundles.append({"name": f"plgd_{name}", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                        "kwargs": {"path": str(folder)}, "team_name": team})
    passwords = home / "passwords.json"
    passwords.write_text(json.dumps({u: f"pw-{u}" for u in USERS}))
    server = ApiServer(home, airflow_postgres_db)
    server.env.update({
        "AIRFLOW__CORE__MULTI_TEAM": "True",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:viewer:{t}" for u, t in USERS.items()),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundles),
        "AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT": json.dumps({"conn_type": "plgd_jetstream", "host": jetstream.host,
                                                           "port": jetstream.port, "extra": {"stream": "EVENTS"}}),
        **spark_connect_conn(spark_connect_server, conn_id="plgd_spark_connect_test"),
    })
    for key in ("SPARK_REMOTE", "SPARK_CONNECT_AUTHENTICATE_TOKEN"):
        server.env.pop(key, None)
    statsd = StatsdListener()  # Airflow's metrics of the processes below, with their tags (test_metrics_monitor)
    server.env.update({f"AIRFLOW__METRICS__{k}": v for k, v in {
        "STATSD_ON": "True", "STATSD_HOST": "127.0.0.1", "STATSD_PORT": str(statsd.port), "STATSD_PREFIX": "airflow",
        "STATSD_INFLUXDB_ENABLED": "True"}.items()})
    shim = _entry_point_shim(tmp_path / "entry_point")
    if shim:
        server.env["PYTHONPATH"] = shim + ":" + server.env["PYTHONPATH"]

    def airflow(*args: str) -> str:
        """``airflow <args>``; ``python -c <code>`` when the first argument is ``-c``."""
        command = [sys.executable, *args] if args[0] == "-c" else [sys.executable, "-m", "airflow", *args]
        done = subprocess.run(command, env=server.env, cwd=home,
                              capture_output=True, text=True, timeout=DAGS_TEST_TIMEOUT_S)
        assert done.returncode == 0, f"airflow {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    shot = Screenshots(ARTIFACTS)
    shots = shot.paths

    with spark_lock():  # a real Airflow component and Spark on the shared 2-core machine
        timings["lock"] = time.monotonic() - t0
        try:
            # no `airflow db migrate`: the database is a copy of the session's migrated template;
            # the teams first: the auth manager refuses to start on teams the database lacks
            airflow("-c", SYNC_AND_RESERIALIZE)
            server.launch()  # it starts while the intervals pass and the runs below go
            publisher.join()
            time.sleep(max(0.0, start_s + 2 * STEP_S + 0.5 - time.time()))  # I1 is over
            timings["airflow ready"] = time.monotonic() - t0
            # I0: a whole run of the ETL DAG (its Spark tasks on the session's Spark Connect server);
            # I1: a run that stopped after its plan (the plan task alone): planned, never committed
            i0_end, i1_end = (datetime.fromtimestamp(start_s + k * STEP_S, tz=timezone.utc).isoformat() for k in (1, 2))
            airflow("dags", "test", "plgd_etl_a", i0_end, "-c", json.dumps({"settle_seconds": 0}))
            timings["I0 run"] = time.monotonic() - t0
            # `tasks test` exits 0 when the task fails, and takes no run conf: the DAG's own params
            # (settle_seconds 0 above) apply, and the output must show the plan's return value
            planned = airflow("tasks", "test", "plgd_etl_a", "plan", i1_end)
            assert "Task failed" not in planned and f"'interval_id': '{ids[1]}'" in planned, planned[-3000:]
            timings["I1 planned"] = time.monotonic() - t0
            chain = _dag_chain_tail(str(roots["a"]), jetstream.url, sim)
            ranges = chain["ranges"]
            dag_runs = dict(server.query("SELECT run_id, data_interval_end FROM dag_run WHERE dag_id = 'plgd_etl_a'"))
            (xcom,), = server.query("SELECT value FROM xcom WHERE dag_id = 'plgd_etl_a' AND task_id = 'summary'"
                                    " AND key = 'return_value'")
            stored = read_stream(jetstream.url)  # ground truth with nats-py
            # I0's run sent its interval counters (its summary task), as its summary and the stream say
            summary_i0 = json.loads(xcom) if isinstance(xcom, str) else xcom  # JSON: decoded by psycopg
            summary_i0 = json.loads(summary_i0) if isinstance(summary_i0, str) else summary_i0
            in_i0 = [seq for seq, (_s, t, _h, _d) in stored.items()
                     if start_s * 10**9 <= t < (start_s + STEP_S) * 10**9]
            check_interval_metrics(statsd.metrics(), summary_i0, len(in_i0), dag_id="plgd_etl_a")
            behind = [seq for seq in stored if seq >= ranges[3][1]]
            window = times.Interval.from_id(ids[1])
            in_i1 = [seq for seq, (_s, t, _h, _d) in stored.items() if window.start_ns <= t < window.end_ns]
            server.wait_ready()
            timings["api-server up"] = time.monotonic() - t0
            api = f"{server.url}/plgd/api/pipelines"
            alice, bob = _token(server, "alice"), _token(server, "bob")

            # 1. the JSON API, as alice (team_a): her pipeline only, the chain's states, tables and lag
            status, listing = _get(api, alice)
            assert status == 200, listing
            assert [p["dag_id"] for p in listing["pipelines"]] == ["plgd_etl_a"], listing
            status, summary = _get(f"{api}/plgd_etl_a", alice)
            assert status == 200, summary
            assert summary["root"] == str(roots["a"]) and summary["stream"] == "EVENTS"
            assert summary["states"] == {"failed": 1, "hole": 1, "stale": 0, "unfinished": 0, "never_planned": 1,
                                         "empty": 1, "committed": 3}, summary["states"]
            assert not summary["healthy"] and summary["chain"]["head"] == ids[3]
            assert summary["lag"]["messages"] == len(behind) > 0, (summary["lag"], summary["lag_error"])
            for name in ("events", "events_deduped", "msgid_index"):
                table = DeltaTable(str(roots["a"] / name))
                shown = summary["tables"][name]
                assert (shown["version"], shown["files"]) == (table.version(), len(table.file_uris())), (name, shown)
                assert shown["rows"] == sum(table.get_add_actions(flatten=True).column("num_records").to_pylist())
            assert sum(b["intervals"] for b in summary["overview"]) == 7  # and the stretch no plan recorded
            status, page = _get(f"{api}/plgd_etl_a/intervals?limit=100", alice)
            assert status == 200, page
            assert {i["interval_id"]: i["state"] for i in page["items"]} == expected
            assert [i["interval_id"] for i in page["items"]] == sorted(expected, reverse=True)
            runs = {i["interval_id"]: i["run_id"] for i in page["items"] if i["run_id"]}
            (i0_run,) = [r for r, end in dag_runs.items()  # the run whose data interval is I0
                         if end and end.timestamp() == start_s + STEP_S]
            assert runs == {ids[0]: i0_run}, (runs, dag_runs)
            hole = next(i for i in page["items"] if i["state"] == "hole")
            assert hole["messages"] == len(in_i1) > 0, (hole, in_i1)
            status, paged = _get(f"{api}/plgd_etl_a/intervals?limit=2&offset=2&order=asc", alice)
            assert [i["interval_id"] for i in paged["items"]] == [ids[2], ids[3]] and paged["total"] == 7
            status, holes = _get(f"{api}/plgd_etl_a/intervals?state=hole", alice)
            assert [i["interval_id"] for i in holes["items"]] == [ids[1]]
            status, gaps = _get(f"{api}/plgd_etl_a/intervals?state=never_planned", alice)  # I5, apart from the hole
            assert [(i["interval_id"], i["run_id"]) for i in gaps["items"]] == [(ids[5], None)], gaps
            assert [(g["start"], g["end"]) for g in summary["chain"]["never_planned"]] == [(gaps["items"][0]["start"],
                                                                                             gaps["items"][0]["end"])]

            # 2. auth: bob (team_b) may not read plgd_etl_a: no data; no token: 401
            status, listing = _get(api, bob)
            assert [p["dag_id"] for p in listing["pipelines"]] == ["plgd_etl_b"], listing
            for path in ("plgd_etl_a", "plgd_etl_a/intervals"):
                status, body = _get(f"{api}/{path}", bob)
                assert status == 403, (path, body)
                assert ids[1] not in json.dumps(body) and str(roots["a"]) not in json.dumps(body)
            assert _get(f"{api}/plgd_etl_a", None)[0] == 401
            assert _get(f"{api}/plgd_etl_b", bob)[0] == 200

            timings["API checked"] = time.monotonic() - t0
            # 3. the page in Chromium, signed in with the UI's cookie
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                try:
                    context = browser.new_context(viewport={"width": 1400, "height": 1300})
                    context.add_cookies([{"name": "_token", "value": alice, "url": server.url}])
                    page = context.new_page()
                    page.set_default_timeout(UI_TIMEOUT_MS)
                    # the nav entry: Browse > plgd pipelines, the page in Airflow's iframe
                    page.goto(f"{server.url}/plugin/plgd", wait_until="networkidle")
                    frame = page.frame_locator("iframe")
                    frame.locator("#intervals tbody tr").first.wait_for()
                    page.wait_for_timeout(500)
                    shot(page, "alice-in-airflow-nav")
                    rows = frame.locator("#intervals tbody tr")
                    shown = {rows.nth(i).get_attribute("data-interval-id"): rows.nth(i).get_attribute("data-state")
                             for i in range(rows.count())}
                    assert shown == expected, shown
                    strip = frame.locator("#strip span")
                    assert [strip.nth(i).get_attribute("data-state") for i in range(strip.count())] == \
                        [expected[i] for i in sorted(expected)]
                    assert "NOT HEALTHY" in frame.locator("#health").inner_text()
                    assert f"hole: {ids[1]}" in frame.locator("#problems").inner_text()
                    assert frame.locator("[data-fact=Lag]").inner_text().startswith(f"{len(behind)} messages")
                    link = frame.locator(f"tr[data-interval-id='{ids[0]}'] a")
                    assert link.get_attribute("href") == f"/dags/plgd_etl_a/runs/{quote(i0_run, safe='')}"
                    # the page alone, filtered to the hole
                    page.goto(f"{server.url}/plgd/?dag_id=plgd_etl_a", wait_until="networkidle")
                    page.locator("#intervals tbody tr").first.wait_for()
                    shot(page, "alice-page")
                    page.locator("label[data-count=hole] input").check()
                    page.wait_for_function("document.querySelectorAll('#intervals tbody tr').length === 1")
                    assert page.locator("#intervals tbody tr").get_attribute("data-interval-id") == ids[1]
                    shot(page, "alice-holes-only")
                    link.page.context.clear_cookies()
                    # bob: asks for plgd_etl_a, gets his own pipeline; nothing of alice's chain
                    context.add_cookies([{"name": "_token", "value": bob, "url": server.url}])
                    page.goto(f"{server.url}/plgd/?dag_id=plgd_etl_a", wait_until="networkidle")
                    page.locator("#page-info").get_by_text("no interval").wait_for()
                    shot(page, "bob-page")
                    assert page.locator("#pipeline").input_value() == "plgd_etl_b"
                    assert ids[1] not in page.content() and "plgd_etl_a" not in page.content()
                finally:
                    browser.close()
        finally:
            server.stop()
            statsd.stop()
    print(f"\nplgd UI test: {time.monotonic() - t0:.1f} s ({', '.join(f'{k} {v:.1f}' for k, v in timings.items())});"
          " screenshots:\n  " + "\n  ".join(shots))
