"""A ``Nats-Msg-Id`` reused outside JetStream's duplicate window (issue 39), through real parts.

JetStream drops a repeated ``Nats-Msg-Id`` only within the stream's ``duplicate_window``. Here the
window is 200 ms, and messages are published to nats-server around it: a publisher that reuses an
ID later for another owner's event (a counter reset, a bridge forwarding IDs) gets two stored
messages, and so does one that repeats a message after the window. The fetch operator stages two
intervals; one client of the session's Spark Connect server (``spark_connect_server``: the point is
dedupe's decision, not the ``spark-submit`` path, which docs/testing.md names its tests for) runs
decode and dedupe on both; ``events_deduped`` is read with deltalake and polars. Another event under a reused ID is kept and counted as an ``id_conflict``
(within the interval and across the lookback); the same message again is still dropped, with a
header ID and with a derived one (no header, as plgd publishes).
"""

from __future__ import annotations

import json
import textwrap
import time

import pytest

from airflow_provider_plgd import times
from airflow_provider_plgd.operators.jetstream_to_staging import JetStreamToStagingOperator
from airflow_provider_plgd.simulator import SimulationConfig, generate
from plgd_devtools.nats_server import BUNDLE_STREAM_CONFIG, recreate_stream
from plgd_devtools.spark import spark_lock
from tests.integration.conftest import publish_messages, read_stream, run_connect_client
from tests.integration.delta_read import read_both

pytestmark = pytest.mark.spark

WINDOW_S = 0.2
EVENT_TYPE = "devicemetadataupdated"

DRIVER = textwrap.dedent('''
    import json, sys
    from airflow_provider_plgd.spark import session
    from airflow_provider_plgd.spark_apps import decode_events, dedupe_events

    cfg = json.load(open(sys.argv[1]))
    spark = session.build_spark_session("plgd-test-msgid-conflict")
    session.ship_code(spark)  # the server's Python workers have no provider
    out = []
    for iid in cfg["intervals"]:
        decode_events.run(spark, decode_events.parse_args(["--root", cfg["root"], "--interval-id", iid]))
        out.append(dedupe_events.run(spark, dedupe_events.parse_args(["--root", cfg["root"], "--interval-id", iid])))
    spark.stop()
    json.dump(out, open(cfg["out"], "w"), default=str)
''')


def test_a_reused_msg_id_keeps_both_events_and_a_true_duplicate_is_dropped(jetstream, storage_root, tmp_path,
                                                                           spark_connect_server):
    sim = generate(SimulationConfig(seed=1, owners=2, devices_per_owner=1, resources_per_device=1, intervals=1,
                                    steps_per_interval=5))
    by_owner: dict[str, list] = {}
    for m in sim.messages:
        if m.event_type == EVENT_TYPE:
            by_owner.setdefault(m.owner_id, []).append(m)
    (o1, mine), (o2, theirs) = sorted(by_owner.items(), key=lambda kv: len(kv[1]))
    assert len(mine) >= 2 and len(theirs) >= 3
    a, e = mine[0], mine[1]
    f, d, b = theirs[0], theirs[1], theirs[2]
    assert len({m.data for m in (a, e, f, d, b)}) == 5 and d.msg_id.startswith("ra:")

    def msg(m, header=None):
        return (m.subject, m.data, {"Nats-Msg-Id": header} if header else None)

    recreate_stream(jetstream.url, {**BUNDLE_STREAM_CONFIG, "duplicate_window": int(WINDOW_S * 1e9)})
    start = time.time_ns()
    # interval 1; between the batches the window passes (the server forgets IDs on a timer: up to ~2 windows)
    gap = 3 * WINDOW_S + 0.2
    publish_messages(jetstream.url, [msg(a, "pub-1"), msg(a, "pub-1"),  # the repeat within the window: not stored
                                     msg(e, "pub-2"), msg(d)])
    time.sleep(gap)
    publish_messages(jetstream.url, [msg(f, "pub-2"),   # another owner's event under e's ID: stored
                                     msg(d)])           # no header (plgd), again: the derived ID, stored twice
    time.sleep(gap)
    publish_messages(jetstream.url, [msg(e, "pub-2")])  # the same message after the window: stored twice
    mid = time.time_ns()
    time.sleep(gap)
    # interval 2
    publish_messages(jetstream.url, [msg(b, "pub-1")])  # another event under an ID of interval 1
    time.sleep(gap)
    publish_messages(jetstream.url, [msg(a, "pub-1"),   # interval 1's message again
                                     msg(d)])           # interval 1's header-less message again
    end = time.time_ns() + 1
    stored = read_stream(jetstream.url)
    assert len(stored) == 9  # JetStream dropped only the repeat within its window

    intervals = [times.interval_id(start, mid), times.interval_id(mid, end)]
    for lo, hi in ((start, mid), (mid, end)):
        done = JetStreamToStagingOperator(task_id="fetch", owner_ids=[o1, o2], event_types=[EVENT_TYPE],
                                          start_time=lo, end_time=hi, storage_root=storage_root).execute({"params": {}})
        assert done["count"] == (6 if lo == start else 3)

    cfg = {"root": storage_root, "intervals": intervals, "out": str(tmp_path / "out.json")}
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    (tmp_path / "driver.py").write_text(DRIVER)
    with spark_lock():
        run_connect_client(spark_connect_server, tmp_path / "driver.py", str(tmp_path / "cfg.json"),
                           log=tmp_path / "client.log", timeout=600)
    first, second = json.loads((tmp_path / "out.json").read_text())

    seq_of = {(subject, data): [] for subject, _, _, data in stored.values()}
    for seq, (subject, _, _, data) in sorted(stored.items()):
        seq_of[(subject, data)].append(seq)

    def kept(iid):  # (msg_id, stream_seq) of events_deduped, read with deltalake (and polars)
        return sorted((r["msg_id"], r["stream_seq"]) for r in read_both(f"{storage_root}/events_deduped", "msg_id",
                                                                        interval_id=iid))

    # interval 1: both events under "pub-2" kept (e first); e's and d's repeats dropped
    assert kept(intervals[0]) == sorted([("pub-1", seq_of[(a.subject, a.data)][0]),
                                         ("pub-2", seq_of[(e.subject, e.data)][0]),
                                         ("pub-2", seq_of[(f.subject, f.data)][0]),
                                         (d.msg_id, seq_of[(d.subject, d.data)][0])])
    assert (first["input"], first["output"], first["within_batch_duplicates"], first["cross_batch_duplicates"],
            first["id_conflicts"]) == (6, 4, 2, 0, 1)
    # interval 2: b kept under interval 1's "pub-1"; a and d seen before with the same content: dropped
    assert kept(intervals[1]) == [("pub-1", seq_of[(b.subject, b.data)][0])]
    assert (second["input"], second["output"], second["within_batch_duplicates"], second["cross_batch_duplicates"],
            second["id_conflicts"]) == (3, 1, 0, 2, 1)
    assert second["previous_intervals"] == [intervals[0]]
