"""Unit tests of the plgd traffic simulator (no server): the state fold on hand-made events (RA
semantics, docs/wire-format.md §4), the fast encoding, the ground-truth directory and the CLI.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pyarrow.parquet as pq
import pytest

from airflow_provider_plgd.plgd import codec
from airflow_provider_plgd.plgd.content import content_to_json
from airflow_provider_plgd.simulator import (
    SimulationConfig,
    cli,
    expected_state,
    generate,
)
from airflow_provider_plgd.simulator.encode import encode_record, to_message
from airflow_provider_plgd.simulator.records import (
    EMPTY_CONTENT,
    Connection,
    Content,
    IsEvent,
    Link,
    Meta,
    RaEvent,
    TwinSync,
)
from airflow_provider_plgd.simulator.state import StateFold
from plgd_devtools.ground_truth import GroundTruth
from tests.unit.simulator.sim_configs import ALL_FAULTS, BASE

# ---- the fold on hand-made events (RA semantics, docs/wire-format.md §4) -------------------------

O, D, H = "owner-token", "dev-1", "/light/1"  # noqa: E741 - owner, device, href of the tables below


def _meta(v, ts, corr=""):
    return Meta(v, ts, "1.2.3.4:5", v + 1, "u", corr, "owner", "hub")


def _rc(v, ts, data=b"\xa1avax", status=1):
    return RaEvent("resourcechanged", O, D, H, _meta(v, ts), {
        "content": Content(data, "application/vnd.ocf+cbor", 10000), "status": status, "etag": b"\x01\x02",
        "types": ("core.light",)})


def _pending(kind, v, ts, corr, valid_until):
    fields = {"valid_until": valid_until, "types": ()}
    if kind in ("update", "create"):
        fields["content"] = EMPTY_CONTENT
    if kind in ("update", "retrieve", "delete"):
        fields["interface"] = ""
    if kind == "retrieve":
        fields["etags"] = ()
    return RaEvent(f"resource{kind}pending", O, D, H, _meta(v, ts, corr), fields)


def _confirm(kind, v, ts, corr, status=1):
    fields = {"status": status, "content": EMPTY_CONTENT, "types": ()}
    if kind == "retrieve":
        fields["etag"] = b""
    return RaEvent(f"resource{kind}d" if kind != "retrieve" else "resourceretrieved", O, D, H,
                   _meta(v, ts, corr), fields)


def _pend(corr, vu, v, ts):
    return {"correlation_id": corr, "valid_until": vu, "version": v, "timestamp": ts}


def test_fold_resource_pendings_and_gaps():
    f = StateFold()
    f.apply(IsEvent("devicesregistered", O, "owner", (D,), 5, "u", "hub"))
    f.apply(_rc(0, 10))
    f.apply(_pending("update", 1, 11, "a", 0))
    f.apply(_pending("update", 2, 12, "b", 100))  # expires before snapshot time 150
    f.apply(_pending("retrieve", 3, 13, "c", 200))
    f.apply(_pending("delete", 4, 14, "d", 0))
    f.apply(_confirm("update", 5, 15, "a"))
    # version 6 missing
    f.apply(_confirm("delete", 7, 17, "d", status=4))  # FORBIDDEN: only its delete pending goes
    row = f.rows(150)["resources"][0]
    assert row["update_pendings"] == []  # "a" confirmed, "b" expired at 150
    assert row["retrieve_pendings"] == [_pend("c", 200, 3, 13)]
    assert row["delete_pendings"] == []
    assert (row["version"], row["timestamp"], row["complete"]) == (7, 17, False)
    assert row["missing_versions"] == [{"first": 6, "last": 6}]
    assert row["status"] == "OK" and row["etag"] == "AQI=" and row["content_json"] == '{"v":"x"}'
    assert f.rows(100)["resources"][0]["update_pendings"] == [_pend("b", 100, 2, 12)]  # not yet expired
    f.apply(_pending("create", 8, 18, "e", 0))
    f.apply(_pending("delete", 9, 19, "g", 0))
    f.apply(_confirm("delete", 10, 20, "g", status=1))  # OK: clears every list
    row = f.rows(150)["resources"][0]
    assert [row[f"{k}_pendings"] for k in ("create", "retrieve", "update", "delete")] == [[], [], [], []]
    assert row["content_json"] == '{"v":"x"}'  # latest content kept
    f.apply(_rc(11, 21, data=b"", status=5))  # NOT_FOUND after unpublish: empty content
    row = f.rows(150)["resources"][0]
    assert (row["status"], row["content_json"], row["coap_content_format"]) == ("NOT_FOUND", None, 10000)


def test_fold_first_version_above_zero_and_snapshot_reset():
    f = StateFold()
    f.apply(_rc(3, 10))
    row = f.rows(0)["resources"][0]
    assert row["complete"] is False and row["missing_versions"] == [{"first": 0, "last": 2}]
    snap = RaEvent("resourcestatesnapshottaken", O, D, H, _meta(4, 11), {
        "latest": _rc(3, 10, data=b"\xa1avay"), "types": ("core.light",),
        "pendings": {"create": (), "retrieve": (), "update": (_pending("update", 2, 9, "z", 0),), "delete": ()}})
    f.apply(snap)
    row = f.rows(0)["resources"][0]
    assert row["complete"] is True and row["missing_versions"] == []
    assert row["content_json"] == '{"v":"y"}' and row["update_pendings"] == [_pend("z", 0, 2, 9)]
    assert row["version"] == 4


def test_fold_links_metadata_and_unregistration():
    f = StateFold()
    link = Link(H, D, ("core.light",), ("oic.if.a",), "ocf://x", "L", ("application/vnd.ocf+cbor",), 0, 3,
                (("coaps+tcp://1.2.3.4:5684", 1),))
    link2 = replace(link, href="/x")
    f.apply(IsEvent("devicesregistered", O, "owner", (D,), 1, "u", "hub"))
    f.apply(RaEvent("resourcelinkspublished", O, D, None, _meta(0, 2), {"links": (link, link2)}))
    f.apply(RaEvent("resourcelinkspublished", O, D, None, _meta(1, 3), {"links": (replace(link, title="L2"),)}))
    f.apply(RaEvent("resourcelinksunpublished", O, D, None, _meta(2, 4), {"hrefs": ("/x",)}))
    rows = f.rows(0)["device_links"]
    assert [(r["href"], r["title"], r["version"], r["timestamp"]) for r in rows] == [(H, "L2", 1, 3)]
    conn = Connection(1, "1.2.3.4:5", 5, 4, "svc", ("e",))
    twin = TwinSync(3, 6, 7, "1.2.3.4:5", 9, 0)
    pend = RaEvent("devicemetadataupdatepending", O, D, None, _meta(0, 5, "t"),
                   {"twin_enabled": False, "twin_force_synchronization": None, "valid_until": 0})
    f.apply(pend)
    md = f.rows(0)["device_metadata"][0]
    assert md["twin_enabled"] is True and md["connection_status"] is None  # RA default before an update
    assert md["update_pendings"] == [{"correlation_id": "t", "twin_enabled": False,
                                      "twin_force_synchronization": None, "valid_until": 0, "version": 0,
                                      "timestamp": 5}]
    f.apply(RaEvent("devicemetadataupdated", O, D, None, _meta(1, 8, "t"), {
        "connection": conn, "twin": replace(twin, state=1), "twin_enabled": False, "canceled": False}))
    md = f.rows(0)["device_metadata"][0]
    assert md["update_pendings"] == [] and md["twin_enabled"] is False
    assert (md["connection_status"], md["connection_protocol"], md["twin_synchronization_state"]) == (
        "ONLINE", "COAPS_TCP", "DISABLED")
    f.apply(IsEvent("devicesunregistered", O, "owner", (), 9, "u", "hub"))  # empty list: nothing
    assert f.rows(0)["owner_devices"]
    f.apply(IsEvent("devicesunregistered", O, "owner", (D,), 10, "u", "hub"))
    assert f.rows(0) == {"resources": [], "device_metadata": [], "device_links": [], "owner_devices": []}
    # re-created: versions restart at 0, the new incarnation is complete
    f.apply(RaEvent("resourcelinkspublished", O, D, None, _meta(0, 11), {"links": (link,)}))
    assert f.rows(0)["device_links"][0]["complete"] is True


# ---- encoding ---------------------------------------------------------------------------------


def test_fast_encoding_equals_building_from_scratch():
    """The cached-message fast path gives the same bytes as a fresh message, also when list
    fields change between two uses of the same cached message."""
    r1 = _rc(0, 10)
    r2 = RaEvent("resourcechanged", O, D, H, _meta(1, 11, "c"), {
        "content": EMPTY_CONTENT, "status": 5, "etag": b"", "types": ()})
    r3 = _rc(2, 12)
    conn = Connection(1, "1.2.3.4:5", 5, 4, "svc", ("e1", "e2"))
    m1 = RaEvent("devicemetadataupdated", O, D, None, _meta(0, 1), {
        "connection": conn, "twin": TwinSync(2, 3, 0, "1.2.3.4:5", 7, 0), "twin_enabled": True, "canceled": False})
    m2 = RaEvent("devicemetadataupdated", O, D, None, _meta(1, 2), {
        "connection": replace(conn, status=0, service_id="", local_endpoints=()),
        "twin": TwinSync(0, 0, 0, "", 0, 0), "twin_enabled": False, "canceled": True})
    for rec in (r1, r2, r3, m1, m2, m1):
        assert encode_record(rec) == codec.encode_resource_aggregate_event(rec.event_type, to_message(rec))


# ---- ground truth and CLI ---------------------------------------------------------------------


def test_ground_truth_directory(tmp_path, faulty):
    out = GroundTruth(faulty).write(tmp_path / "gt")
    table = pq.read_table(out / "messages.parquet")
    assert table.num_rows == len(faulty.messages)
    assert table.column_names == ["stream_seq", "subject", "interval", "event_type", "owner_id", "device_id", "href",
                                  "aggregate_id", "version", "timestamp_ns", "msg_id", "fault", "bytes"]
    rows = table.to_pylist()
    assert rows[5]["subject"] == faulty.messages[5].subject and rows[5]["stream_seq"] is None
    assert sum(r["bytes"] for r in rows) == faulty.messages.total_bytes
    assert [r["msg_id"] for r in rows] == [m.msg_id for m in faulty.messages]
    assert [r["fault"] for r in rows] == [m.fault for m in faulty.messages]
    assert [r["version"] for r in rows] == [m.version for m in faulty.messages]
    for k in range(3):
        assert json.loads((out / f"state_{k}.json").read_text()) == expected_state(faulty, k)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["messages"] == len(faulty.messages)
    assert sum(c["messages"] for c in summary["counts"]) == len(faulty.messages)
    assert sum(c["bytes"] for c in summary["counts"]) == faulty.messages.total_bytes
    assert summary["corrupt"]["total"] == 4 and summary["duplicates"]["total"] >= 2
    assert [i["start_ns"] for i in summary["intervals"]] == [s for s, _ in faulty.interval_bounds()]
    assert summary["config"]["seed"] == 3 and summary["version_gaps"] and summary["unregistrations"]


def test_cli_dry_run_writes_ground_truth(tmp_path, capsys):
    argv = ["--seed", "5", "--owners", "2", "--devices", "2", "--resources", "3", "--intervals", "2",
            "--interval-seconds", "5", "--faults", "duplicates,corrupt,snapshots,gaps,unregister",
            "--leadrt", "first", "--start-time", "2026-01-01T00:00:00Z", "--dry-run", "--ground-truth",
            str(tmp_path / "gt")]
    assert cli.main(argv) == 0
    assert "generated" in capsys.readouterr().out
    summary = json.loads((tmp_path / "gt" / "summary.json").read_text())
    assert summary["config"]["start_time_ns"] == 1_767_225_600_000_000_000
    assert summary["config"]["leadrt"] == "first" and summary["config"]["corrupt"] == 3
    assert summary["config"]["old_hub_snapshots"] and summary["config"]["unregister"]
    again = tmp_path / "gt2"
    assert cli.main([*argv[:-1], str(again)]) == 0
    assert (again / "state_1.json").read_text() == (tmp_path / "gt" / "state_1.json").read_text()


def test_cli_help_documents_every_flag(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--servers", "--stream", "--create-stream", "--seed", "--owners", "--devices", "--resources",
                 "--intervals", "--interval-seconds", "--faults", "--leadrt", "--ground-truth", "--no-wait",
                 "--target-messages", "--start-time", "--dry-run", "--steps-per-interval"):
        assert flag in text
    parser = cli.build_parser()
    for action in parser._actions:
        assert action.help, action.option_strings


def test_cli_rejects_unknown_fault(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--faults", "duplicates,bogus", "--dry-run"])
    assert exc.value.code == 2
    assert "bogus" in capsys.readouterr().err


@pytest.fixture
def without_devtools(monkeypatch):
    """An installed provider without the repository's plgd_devtools (the wheel does not ship it)."""
    import sys

    for name in [n for n in sys.modules if n == "plgd_devtools" or n.startswith("plgd_devtools.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "plgd_devtools", None)  # import plgd_devtools -> ModuleNotFoundError


def test_cli_without_devtools_publishes_but_refuses_ground_truth_and_corrupt(without_devtools, tmp_path, capsys):
    base = ["--seed", "5", "--owners", "1", "--devices", "2", "--intervals", "1", "--interval-seconds", "5",
            "--start-time", "2026-01-01T00:00:00Z", "--dry-run"]
    # every option that needs no development tool works
    assert cli.main([*base, "--faults", "duplicates,snapshots,gaps,unregister"]) == 0
    assert "generated" in capsys.readouterr().out
    for option, feature in ((["--ground-truth", str(tmp_path / "gt")], "--ground-truth"),
                            (["--faults", "corrupt"], "--faults corrupt"),
                            (["--faults", "all"], "--faults corrupt")):
        with pytest.raises(SystemExit) as exc:
            cli.main([*base, *option])
        assert exc.value.code == 2
        captured = capsys.readouterr()
        assert f"{feature} needs plgd_devtools." in captured.err and "source checkout" in captured.err
        assert "generated" not in captured.out  # refused before anything is generated
    assert not (tmp_path / "gt").exists()


def test_generate_corrupt_payloads_without_devtools_is_a_clear_error(without_devtools):
    generate(SimulationConfig(intervals=1, steps_per_interval=2, duplicates=0.1))  # no fault injector needed
    with pytest.raises(ModuleNotFoundError, match=r"corrupt payloads .* needs plgd_devtools\.faults"):
        generate(SimulationConfig(intervals=1, steps_per_interval=2, corrupt=1))


def test_cli_default_start_is_next_aligned_interval():
    args = cli.build_parser().parse_args(["--interval-seconds", "20"])
    cfg = cli.config_from_args(args, now_ns=1_767_225_605_000_000_000)  # 00:00:05
    assert cfg.start_time_ns == 1_767_225_620_000_000_000  # 00:00:20
    cfg = cli.config_from_args(args, now_ns=1_767_225_619_500_000_000)  # 00:00:19.5 -> at least 1 s ahead
    assert cfg.start_time_ns == 1_767_225_640_000_000_000


def test_fold_agrees_with_the_hub_model():
    """The expected state (fold of the published events) equals the hub model's own state,
    except for what was never published (the forced pending of a version gap)."""
    from airflow_provider_plgd.simulator.generator import _Generator

    cfg = replace(BASE, steps_per_interval=300, **ALL_FAULTS)
    gen = _Generator(cfg, cfg.steps_per_interval)
    sim = gen.run()
    end = sim.interval_bounds()[-1][1]
    rows = {(r["device_id"], r["href"]): r for r in sim.states[-1]["resources"]}
    links = {(r["device_id"], r["href"]): r for r in sim.states[-1]["device_links"]}
    metadata = {r["device_id"]: r for r in sim.states[-1]["device_metadata"]}
    registered = [d for d in gen.hub.devices if d.registered]
    assert {r["device_id"] for r in sim.states[-1]["owner_devices"]} == {d.device_id for d in registered}
    for dev in registered:
        md = metadata[dev.device_id]
        assert (md["version"], md["twin_enabled"], md["connection_id"]) == (dev.meta.version, dev.twin_enabled,
                                                                             dev.conn.id)
        open_md = [p.meta.correlation_id for p in dev.meta.pendings
                   if not p.fields["valid_until"] or p.fields["valid_until"] >= end]
        assert [p["correlation_id"] for p in md["update_pendings"]] == open_md
        assert {h for (d, h) in links if d == dev.device_id} == set(dev.links.links)
        for href, res in dev.resources.items():
            row = rows[(dev.device_id, href)]
            assert row["version"] == res.version
            c = res.latest.fields["content"]
            assert row["content_json"] == content_to_json(c.data, c.content_type, c.coap_content_format)
            for kind, pendings in res.pendings.items():
                hub_open = [p.meta.correlation_id for p in pendings
                            if not p.fields["valid_until"] or p.fields["valid_until"] >= end]
                assert [p["correlation_id"] for p in row[f"{kind}_pendings"]] == hub_open
