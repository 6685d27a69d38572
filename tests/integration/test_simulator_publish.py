"""The simulator against a real nats-server: windowed publishing, bulk publishing of 100k
messages read back through ``JetStreamHook.iter_batches``, the CLI, and clear errors."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace

import nats
import pyarrow.parquet as pq
import pytest

from airflow_provider_plgd.hooks.jetstream import JetStreamHook
from airflow_provider_plgd.simulator import PublishError, SimulationConfig, cli, generate, publish
from plgd_devtools.ground_truth import GroundTruth

FAULTS = dict(duplicates=0.05, corrupt=3, old_hub_snapshots=True, version_gaps=True, unregister=True)


def read_all(batch_size: int = 5000):
    hook = JetStreamHook()
    for batch in hook.iter_batches("plgd.>", batch_size=batch_size):
        yield from batch


def next_boundary(step_ns: int, margin_ns: int = 500_000_000) -> int:
    return ((time.time_ns() + margin_ns) // step_ns + 1) * step_ns


def test_publish_inside_interval_windows(jetstream, tmp_path):
    step = 2_000_000_000
    cfg = SimulationConfig(seed=21, owners=2, devices_per_owner=2, resources_per_device=3, intervals=2,
                           steps_per_interval=30, interval_seconds=2.0, start_time_ns=next_boundary(step),
                           leadrt="first", **FAULTS)
    sim = generate(cfg)
    truth = GroundTruth.of(sim, publish(sim, servers=[jetstream.url], stream="EVENTS", wait_for_intervals=True))
    assert truth.first_seq == 1 and truth.last_seq == len(sim.messages)
    info = JetStreamHook().stream_info()
    assert info["state"]["messages"] == len(sim.messages)
    got = list(read_all())
    assert [m.stream_seq for m in got] == list(range(1, len(sim.messages) + 1))
    bounds = sim.interval_bounds()
    for stored, m in zip(got, sim.messages, strict=True):
        assert (stored.subject, stored.data, stored.headers) == (m.subject, m.data, None)
        start, end = bounds[m.interval]
        assert start <= stored.time_ns < end, (m.interval, stored.time_ns - start)
    for w in truth.windows:
        assert w["window_start_ns"] <= w["published_from_ns"] <= w["stored_by_ns"] < w["window_end_ns"]
    out = truth.write(tmp_path / "gt")
    table = pq.read_table(out / "messages.parquet", columns=["stream_seq", "interval", "bytes"]).to_pylist()
    assert [r["stream_seq"] for r in table] == [m.stream_seq for m in got]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["first_seq"] == 1 and summary["publish"]["wait_for_intervals"] is True
    # the JetStream count per interval (server time) equals the ground truth per interval
    hook = JetStreamHook()
    for k, (start, end) in enumerate(bounds):
        assert hook.count_messages("plgd.>", start_time=start, end_time=end) == summary["intervals"][k]["messages"]


def test_publish_100k_messages_and_read_them_back(jetstream, tmp_path):
    cfg = SimulationConfig(seed=5, owners=3, devices_per_owner=4, resources_per_device=3, intervals=3,
                           target_messages=100_000, **FAULTS)
    sim = generate(cfg)
    assert 90_000 <= len(sim.messages) <= 110_000
    t0 = time.perf_counter()
    truth = GroundTruth.of(sim, publish(sim, servers=[jetstream.url], stream="EVENTS", wait_for_intervals=False))
    elapsed = time.perf_counter() - t0
    print(f"published {len(sim.messages)} messages in {elapsed:.1f} s ({len(sim.messages) / elapsed:,.0f} msg/s)")
    summary = truth.summary()
    count = total = 0
    expected_seq = truth.first_seq
    for m in read_all():
        assert m.stream_seq == expected_seq
        expected_seq += 1
        count += 1
        total += len(m.data)
    assert count == summary["messages"] == len(sim.messages)
    assert total == summary["bytes"] == sim.messages.total_bytes
    # spot check content against the ground truth table
    table = truth.message_table()
    hook = JetStreamHook()
    assert hook.stream_info()["state"]["last_seq"] == table.column("stream_seq")[-1].as_py()


def test_second_publish_continues_the_sequences(jetstream):
    cfg = SimulationConfig(seed=2, owners=1, devices_per_owner=1, steps_per_interval=5, intervals=1)
    sim = generate(cfg)
    first = publish(sim, servers=[jetstream.url], wait_for_intervals=False)
    second = publish(sim, servers=[jetstream.url], wait_for_intervals=False)
    assert second.first_seq == first.last_seq + 1


def test_window_already_over_is_a_clear_error(jetstream):
    sim = generate(SimulationConfig(intervals=1, steps_per_interval=1))  # starts 2026-01-01 (fixed)
    sim = replace(sim, config=replace(sim.config, start_time_ns=time.time_ns() - 60_000_000_000))
    with pytest.raises(PublishError, match=r"interval 0 window .* is already over"):
        publish(sim, servers=[jetstream.url])


def test_missing_stream_is_a_clear_error(jetstream):
    sim = generate(SimulationConfig(intervals=1, steps_per_interval=1))
    with pytest.raises(PublishError, match="stream 'NOPE' does not exist"):
        publish(sim, servers=[jetstream.url], stream="NOPE", wait_for_intervals=False)


def test_cli_creates_the_stream_and_publishes(jetstream, tmp_path, capsys):
    async def delete_stream():
        nc = await nats.connect(jetstream.url)
        try:
            await nc.jetstream().delete_stream("EVENTS")
        finally:
            await nc.close()

    asyncio.run(delete_stream())
    argv = ["--servers", jetstream.url, "--stream", "EVENTS", "--create-stream", "--seed", "1", "--owners", "2",
            "--devices", "2", "--resources", "3", "--intervals", "2", "--interval-seconds", "1",
            "--faults", "duplicates,corrupt,snapshots,gaps,unregister", "--leadrt", "uuid",
            "--ground-truth", str(tmp_path / "gt")]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "created stream EVENTS" in out and "published to EVENTS" in out
    info = JetStreamHook().stream_info()
    assert info["config"]["subjects"] == ["plgd.>"]
    assert info["config"]["duplicate_window"] == 600_000_000_000
    assert info["config"]["storage"] == "file" and info["config"]["discard"] == "old"
    summary = json.loads((tmp_path / "gt" / "summary.json").read_text())
    assert info["state"]["messages"] == summary["messages"] and summary["first_seq"] == 1
    assert all(w["stored_by_ns"] < w["window_end_ns"] for w in summary["publish"]["windows"])


def test_interval_overflow_is_a_clear_error(jetstream):
    # A 1 ms window cannot take thousands of messages on any machine: the publisher either finds
    # the window already over when it starts, or sees it overflow. Both are clear errors.
    step = 1_000_000
    cfg = SimulationConfig(seed=3, owners=2, devices_per_owner=2, intervals=1, interval_seconds=0.001,
                           steps_per_interval=12_000, start_time_ns=next_boundary(step, margin_ns=2_000_000_000))
    sim = generate(cfg)
    assert len(sim.messages) > 5_000
    sim = replace(sim, config=replace(cfg, start_time_ns=next_boundary(step)))
    with pytest.raises(PublishError, match=r"interval 0 (overflowed its window|window .* is already over)") as exc:
        publish(sim, servers=[jetstream.url])
    print(exc.value)
