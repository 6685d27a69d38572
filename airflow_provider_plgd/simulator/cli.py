"""``plgd-simulate``: generate deterministic plgd hub traffic, publish it to JetStream, and write
the ground truth.

``--ground-truth`` and ``--faults corrupt`` (or ``all``) need the repository's development tools
(``plgd_devtools.ground_truth``, ``plgd_devtools.faults``), which the provider's wheel does not
ship: they are loaded only for these options, and without them the command stops with exit status
2 and a message saying so.

Example::

    plgd-simulate --servers nats://127.0.0.1:4222 --stream EVENTS --create-stream --seed 1 \\
        --owners 3 --devices 4 --resources 3 --intervals 3 --interval-seconds 20 \\
        --faults duplicates,corrupt,snapshots,gaps,unregister --leadrt off --ground-truth ./truth

Exit status: 0 on success, 2 for bad arguments (or options whose development tools are missing), 1
when publishing fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timezone

from .config import LEADRT_MODES, SimulationConfig
from .devtools import load_devtools
from .generator import generate
from .publisher import PublishError, create_stream, publish

__all__ = ["FAULT_NAMES", "build_parser", "config_from_args", "main"]

#: ``--faults`` names -> what they switch on.
FAULT_NAMES = ("duplicates", "corrupt", "snapshots", "gaps", "unregister")


def _faults(value: str) -> frozenset[str]:
    if value.strip() in ("", "none"):
        return frozenset()
    if value.strip() == "all":
        return frozenset(FAULT_NAMES)
    names = frozenset(v.strip() for v in value.split(",") if v.strip())
    unknown = names - set(FAULT_NAMES)
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown fault(s) {', '.join(sorted(unknown))}; expected a comma-separated subset of "
            f"{', '.join(FAULT_NAMES)}, or 'all' / 'none'"
        )
    return names


def _start_time(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--start-time {value!r}: expected unix nanoseconds or an ISO-8601 time such as 2026-01-01T00:00:00Z"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp()) * 1_000_000_000 + dt.microsecond * 1000


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``plgd-simulate`` (every flag documented in ``--help``)."""
    p = argparse.ArgumentParser(
        prog="plgd-simulate",
        description="Simulate plgd hub traffic (exact NATS wire format, deterministic for a seed), publish it "
        "to a JetStream stream, and write the ground truth (messages.parquet, state_<k>.json, summary.json).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--servers", default="nats://127.0.0.1:4222",
                   help="comma-separated NATS server URLs")
    p.add_argument("--stream", default="EVENTS", help="JetStream stream bound to plgd.>")
    p.add_argument("--create-stream", action="store_true",
                   help="create the stream with the plgd bundle settings (subjects plgd.>, limits, file, "
                        "discard old, duplicate window 10 min) if it does not exist")
    p.add_argument("--seed", type=int, default=1, help="random seed; same seed and flags give the same bytes")
    p.add_argument("--owners", type=int, default=2,
                   help="owners ('owner-1', ...; with 2 or more the last one is a UUID)")
    p.add_argument("--devices", type=int, default=3, help="devices per owner")
    p.add_argument("--resources", type=int, default=3,
                   help="resources per device (/light/1, /oic/d, /switches/1, /light/2, ...)")
    p.add_argument("--intervals", type=int, default=3, help="number of intervals")
    p.add_argument("--interval-seconds", type=float, default=20.0, help="length of one interval in seconds")
    p.add_argument("--steps-per-interval", type=int, default=20,
                   help="random activity steps per interval (about 2-3 messages each)")
    p.add_argument("--faults", type=_faults, default="none",
                   help="comma-separated faults to inject: duplicates (republished identical bytes), corrupt "
                        "(undecodable payloads; needs the repository's plgd_devtools), snapshots (old-hub "
                        "*snapshottaken events), gaps (version gaps), unregister (devices unregistered and "
                        "re-created); or 'all' / 'none'")
    p.add_argument("--duplicate-share", type=float, default=0.02,
                   help="share of messages duplicated when 'duplicates' is on")
    p.add_argument("--corrupt-count", type=int, default=3,
                   help="number of corrupt payloads when 'corrupt' is on")
    p.add_argument("--snapshot-threshold", type=int, default=3,
                   help="events between old-hub snapshots when 'snapshots' is on")
    p.add_argument("--leadrt", choices=LEADRT_MODES, default="off",
                   help="lead-resource-type subjects: off, first (filter=first), uuid (filter=first, useUUID)")
    p.add_argument("--start-time", type=_start_time, default=None,
                   help="start of interval 0 (unix ns or ISO-8601); default: the next multiple of "
                        "--interval-seconds at least 1 s from now")
    p.add_argument("--ground-truth", metavar="DIR", default=None,
                   help="write messages.parquet, state_<k>.json and summary.json into DIR (needs the "
                        "repository's plgd_devtools, not part of the provider's wheel)")
    p.add_argument("--no-wait", action="store_true",
                   help="publish everything at once instead of inside each interval's wall-clock window")
    p.add_argument("--target-messages", type=int, default=None,
                   help="scale activity to about this many messages (benchmarks); overrides --steps-per-interval")
    p.add_argument("--dry-run", action="store_true", help="generate (and write the ground truth) without publishing")
    return p


def config_from_args(args: argparse.Namespace, now_ns: int | None = None) -> SimulationConfig:
    """The :class:`SimulationConfig` for parsed arguments. ``now_ns`` (default: the wall clock)
    is only used when ``--start-time`` is not given. Raises ValueError/TypeError for bad values."""
    start = args.start_time
    if start is None:
        step = round(args.interval_seconds * 1e9)
        now = time.time_ns() if now_ns is None else now_ns
        start = ((now + 1_000_000_000) // step + 1) * step if step > 0 else now
    faults = args.faults
    return SimulationConfig(
        seed=args.seed,
        owners=args.owners,
        devices_per_owner=args.devices,
        resources_per_device=args.resources,
        intervals=args.intervals,
        steps_per_interval=args.steps_per_interval,
        start_time_ns=start,
        interval_seconds=args.interval_seconds,
        leadrt=args.leadrt,
        duplicates=args.duplicate_share if "duplicates" in faults else 0.0,
        corrupt=args.corrupt_count if "corrupt" in faults else 0,
        old_hub_snapshots="snapshots" in faults,
        snapshot_threshold=args.snapshot_threshold,
        version_gaps="gaps" in faults,
        unregister="unregister" in faults,
        target_messages=args.target_messages,
    ).validate()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``plgd-simulate``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    try:  # before anything is generated or published: the options' development tools are there
        ground_truth = load_devtools("ground_truth", "--ground-truth") if args.ground_truth else None
        if config.corrupt:
            load_devtools("faults", "--faults corrupt")
    except ModuleNotFoundError as exc:
        parser.error(str(exc))
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    sim = generate(config)
    log = sim.messages
    print(f"generated {len(log)} messages ({log.total_bytes} bytes) over {config.intervals} intervals of "
          f"{config.interval_seconds:g} s in {sim.generation_seconds:.2f} s", flush=True)
    published = None
    if not args.dry_run:
        try:
            if args.create_stream and create_stream(servers=servers, stream=args.stream):
                print(f"created stream {args.stream} (plgd bundle settings)", flush=True)
            if not args.no_wait:
                start = datetime.fromtimestamp(config.start_time_ns / 1e9, tz=timezone.utc)
                print(f"publishing interval by interval from {start.isoformat()}", flush=True)
            published = publish(sim, servers=servers, stream=args.stream, wait_for_intervals=not args.no_wait)
        except PublishError as exc:
            print(f"plgd-simulate: error: {exc}", file=sys.stderr)
            return 1
        rate = len(log) / published.publish_seconds if published.publish_seconds else 0.0
        print(f"published to {args.stream}: sequences {published.first_seq}..{published.last_seq} in "
              f"{published.publish_seconds:.2f} s ({rate:,.0f} msg/s)", flush=True)
    if ground_truth is not None:
        path = ground_truth.GroundTruth.of(sim, published).write(args.ground_truth)
        print(f"ground truth written to {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
