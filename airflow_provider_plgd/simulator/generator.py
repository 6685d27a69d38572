"""``generate(config) -> Simulation``: run the hub model interval by interval, encode every
published event, inject the configured faults, and record the expected state at the end of
each interval.

Determinism: all randomness comes from two ``random.Random`` instances seeded from
``config.seed`` (traffic, and faults: duplicates and corrupt payloads), and every timestamp
from ``config.start_time_ns`` (``model.Clock``); the wall clock is only read to report
``generation_seconds``.
"""

from __future__ import annotations

import bisect
import functools
import random
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import accumulate
from typing import Any

from ..plgd import ids, lead_resource_type, subjects
from .config import SimulationConfig
from .devtools import load_devtools
from .encode import encode_record
from .hub import Hub
from .messages import FAULT_CODE, MessageLog
from .model import Clock, DeviceSim
from .records import IsEvent, RaEvent
from .state import StateFold

__all__ = ["Simulation", "generate"]

_DUPLICATE = FAULT_CODE["duplicate"]
_CORRUPT = FAULT_CODE["corrupt"]
_LINKS_TYPES = frozenset({"resourcelinkspublished", "resourcelinksunpublished", "resourcelinkssnapshottaken"})

# Random step actions and their weights (an action that does not apply falls back to a notification).
_ACTIONS: list[tuple[str, float]] = [
    ("notify", 50),
    ("update", 8),
    ("retrieve", 5),
    ("create", 3),
    ("delete", 3),
    ("confirm_late", 5),
    ("reconnect", 4),
    ("twin_toggle", 3),
    ("force_sync", 2),
    ("links_title", 3),
    ("links_toggle", 3),
]
_FAULT_ACTIONS = {"unregister": ("unregister", 0.5), "version_gaps": ("gap", 0.5)}
# The first random steps of interval 0 take these actions in order (commands confirmed at once),
# so that even short simulations contain every live event type.
_TOUR = ("update", "retrieve", "create", "delete", "force_sync", "twin_toggle", "links_title", "links_toggle",
         "reconnect")


@dataclass
class Simulation:
    """The result of ``generate``.

    :ivar config: the config it was generated from.
    :ivar messages: every message in publish order (a list-like :class:`MessageLog` of
        :class:`SimMessage`; intervals are non-decreasing).
    :ivar states: ``states[k]`` = expected snapshot tables at the end of interval k (use
        ``expected_state(sim, k)``, which returns a copy).
    :ivar steps_per_interval: the activity steps per interval actually used (calibrated when
        ``config.target_messages`` is set).
    :ivar owners: ``[{"owner", "owner_id", "device_ids"}]``.
    :ivar gaps: version ranges that were not published:
        ``[{"device_id", "href", "aggregate_id", "first", "last", "reason"}]``.
    :ivar corrupt: ``[{"index", "interval", "subject", "kind"}]``.
    :ivar unregistrations: ``[{"device_id", "owner_id", "interval", "timestamp"}]``.
    :ivar generation_seconds: wall-clock duration of ``generate`` (s).
    """

    config: SimulationConfig
    messages: MessageLog
    states: list[dict[str, list[dict[str, Any]]]]
    steps_per_interval: int
    owners: list[dict[str, Any]]
    gaps: list[dict[str, Any]]
    corrupt: list[dict[str, Any]]
    unregistrations: list[dict[str, Any]]
    generation_seconds: float = 0.0
    duplicates: dict[str, int] = field(default_factory=dict)

    def interval_bounds(self) -> list[tuple[int, int]]:
        """``[(start_ns, end_ns), ...]`` per interval (end exclusive)."""
        return self.config.interval_bounds()


class _Generator:
    def __init__(self, config: SimulationConfig, steps: int) -> None:
        self.config = config
        self.steps = steps
        self.rng = random.Random(config.seed)
        self.fault_rng = random.Random(f"plgd-simulate-faults-{config.seed}")
        # the corrupt-payload injector is a development tool (plgd_devtools.faults): loaded only when asked for
        self.faults: Any = load_devtools("faults", "corrupt payloads (SimulationConfig.corrupt, plgd-simulate --faults "
                                    "corrupt)") if config.corrupt else None
        self.clock = Clock(config, self.rng)
        self.hub = Hub(config, self.rng, self.clock)
        self.log = MessageLog()
        self.fold = StateFold()
        self.states: list[dict[str, list[dict[str, Any]]]] = []
        self.corrupt: list[dict[str, Any]] = []
        self._routes: dict[tuple, tuple[str, int]] = {}
        self._carry_next: list[int] = []
        self._dup_counts = {"right_after": 0, "next_interval": 0}
        self._right_after_in_interval = 0
        self._last_original = -1
        self._tour = list(reversed(_TOUR))
        actions = list(_ACTIONS)
        for flag, action in _FAULT_ACTIONS.items():
            if getattr(config, flag):
                actions.append(action)
        self._action_names = [a for a, _ in actions]
        self._cum_weights = list(accumulate(w for _, w in actions))
        leadrt = config.leadrt
        self._leadrt = leadrt != "off"
        self._use_uuid = leadrt == "uuid"

    # ---- routing and emission -------------------------------------------------------------

    def _route(self, rec: RaEvent | IsEvent) -> tuple[str, int]:
        et = rec.event_type
        if isinstance(rec, IsEvent):
            cache_key: tuple = (et, rec.owner_id)
            hit = self._routes.get(cache_key)
            if hit is None:
                subject = subjects.registrations_subject(rec.owner_id, et)
                hit = self._routes[cache_key] = (subject, self.log.key_id((et, rec.owner_id, None, None, None)))
            return hit
        href = rec.href
        types = rec.fields.get("types") if (self._leadrt and href is not None) else None
        cache_key = (et, rec.device_id, href, types)
        hit = self._routes.get(cache_key)
        if hit is None:
            owner_id, device_id = rec.owner_id, rec.device_id
            if href is None:
                if et in _LINKS_TYPES:
                    subject = subjects.links_subject(owner_id, device_id, et)
                    aggregate_id = ids.links_aggregate_id(device_id)
                else:
                    subject = subjects.metadata_subject(owner_id, device_id, et)
                    aggregate_id = ids.metadata_aggregate_id(device_id)
            else:
                aggregate_id = ids.resource_aggregate_id(device_id, href)
                if not self._leadrt or et == "resourcestatesnapshottaken":  # old hubs had no leadrt
                    subject = subjects.resource_subject(owner_id, device_id, ids.href_id(href), et)
                else:
                    assert types is not None  # the simulator's resource events always carry their types
                    lead = lead_resource_type.select_lead_resource_type(types, filter="first", use_uuid=self._use_uuid)
                    subject = subjects.resource_subject(owner_id, device_id, ids.href_id(href), et, leadrt=True,
                                                        lead_resource_type=lead)
            hit = self._routes[cache_key] = (subject, self.log.key_id((et, owner_id, device_id, href, aggregate_id)))
        return hit

    def _emit(self, k: int) -> None:
        log = self.log
        p = self.config.duplicates
        last = self.config.intervals - 1
        for rec, published, fault in self.hub.drain():
            if not published:
                continue
            subject, key_id = self._route(rec)
            if isinstance(rec, IsEvent):
                version, ts = -1, rec.timestamp
            else:
                version, ts = rec.meta.version, rec.meta.timestamp
            i = log.append(subject, encode_record(rec), k, key_id, version, ts, FAULT_CODE[fault])
            self.fold.apply(rec)
            self._last_original = i
            if p and self.fault_rng.random() < p:
                if k == last or self.fault_rng.random() < 0.5:
                    self._duplicate_now(i, k)
                else:
                    self._carry_next.append(i)

    def _duplicate_now(self, i: int, k: int) -> None:
        self.log.copy_as(i, k, _DUPLICATE)
        self._dup_counts["right_after"] += 1
        self._right_after_in_interval += 1

    def _corrupt_message(self, k: int, kind: str) -> None:
        log = self.log
        for _ in range(1000):
            base = self.fault_rng.randrange(len(log))
            if log.fault_codes[base] != _CORRUPT:
                break
        subject = log.subjects[base]
        event_type, owner_id, device_id, href, _ = log.keys[log.key_index[base]]
        data = self.faults.corrupt_payload(kind, subject, log.data[base], self.fault_rng)
        key_id = log.key_id((event_type, owner_id, device_id, href, None))
        i = log.append(subject, data, k, key_id, -1, self.clock.tick(), _CORRUPT)
        self.corrupt.append({"index": i, "interval": k, "subject": subject, "kind": kind})

    # ---- steps ----------------------------------------------------------------------------

    def _random_step(self) -> None:
        hub, rng = self.hub, self.rng
        dev = rng.choice(hub.devices)
        if not dev.registered:
            if self.config.unregister and rng.random() < 0.5:
                hub.register(dev)
            return
        if not dev.online:
            hub.reconnect(dev)
            return
        if self._tour:
            action, confirm_now = self._tour.pop(), True
        else:
            action = self._action_names[bisect.bisect_right(self._cum_weights, rng.random() * self._cum_weights[-1])]
            confirm_now = False
        published = dev.published_resources()
        if not published:
            hub.republish(dev, rng.choice(list(dev.resources.values())))
            return
        res = rng.choice(published)
        if action in ("update", "retrieve", "create", "delete"):
            hub.command(dev, res, action, confirm_now=confirm_now)
        elif action == "confirm_late" and hub.confirm_late(dev):
            pass
        elif action == "reconnect":
            hub.reconnect(dev)
        elif action == "twin_toggle" and not hub.has_open_metadata_command(dev):
            hub.metadata_command(dev, force_sync=False, confirm_now=confirm_now)
        elif action == "force_sync" and dev.twin_enabled and not hub.has_open_metadata_command(dev):
            hub.metadata_command(dev, force_sync=True, confirm_now=confirm_now)
        elif action == "links_title":
            hub.links_title(dev, res)
        elif action == "links_toggle":
            unpublished = [r for r in dev.resources.values() if not r.published]
            if unpublished and rng.random() < 0.6:
                hub.republish(dev, rng.choice(unpublished))
            else:
                hub.unpublish(dev, res)
        elif action == "unregister" and sum(d.registered for d in hub.devices) >= 2:
            hub.unregister(dev)
        elif action == "gap":
            hub.forced_update_on_unpublished(dev, rng.choice(list(dev.resources.values())))
        else:
            hub.notify(dev, res)

    def _scheduled_gap(self, dev: DeviceSim) -> None:
        if not dev.registered:
            return
        if not dev.online:
            self.hub.reconnect(dev)
        self.hub.forced_update_on_unpublished(dev, list(dev.resources.values())[-1])

    def _steps_in(self, k: int) -> int:
        return max(1, self.steps + (len(self.hub.devices) if k == 0 else 0))

    def _schedule(self) -> dict[tuple[int, int], list[Callable[[], None]]]:
        """Fault actions that must happen at least once (so small simulations contain them)."""
        cfg, hub = self.config, self.hub
        sched: dict[tuple[int, int], list[Callable[[], None]]] = defaultdict(list)
        D, S = len(hub.devices), self.steps

        def at(k: int, j: int, fn: Callable[[], None]) -> None:
            sched[(k, min(j, self._steps_in(k) - 1))].append(fn)

        if cfg.version_gaps:
            gap_dev = hub.devices[0]
            at(0, D + S // 3, lambda: self._scheduled_gap(gap_dev))
        if cfg.old_hub_snapshots:
            old_dev = next(d for d in hub.devices if d.old_hub)

            def links_churn() -> None:
                # enough link changes on an old-hub device for a resourcelinkssnapshottaken
                if old_dev.registered and old_dev.online:
                    for _ in range(cfg.snapshot_threshold):
                        published = old_dev.published_resources()
                        if published:
                            hub.links_title(old_dev, self.rng.choice(published))

            at(0, D + S // 4, links_churn)
        if cfg.unregister:
            target = hub.devices[-1]

            def unregister() -> None:
                if target.registered:
                    hub.unregister(target)

            def recreate() -> None:
                if not target.registered:
                    hub.register(target)

            at(0, D + S // 2, lambda: hub.unregister_nothing(hub.owners[0]))
            at(0, D + (2 * S) // 3, unregister)
            if cfg.intervals >= 2:
                at(1, S // 3, recreate)
            else:
                at(0, D + (5 * S) // 6, recreate)
        for i in range(cfg.corrupt):
            k = self.fault_rng.randrange(cfg.intervals)
            j = self.fault_rng.randrange(self._steps_in(k))
            kind = self.faults.CORRUPT_KINDS[i % len(self.faults.CORRUPT_KINDS)]
            sched[(k, j)].append(functools.partial(self._corrupt_message, k, kind))
        return sched

    def _ensure_duplicates(self, k: int) -> None:
        """With ``duplicates > 0``: at least one right-after duplicate per interval, and at least
        one duplicate carried into the next interval (when there is one)."""
        if not self.config.duplicates or self._last_original < 0:
            return
        if self._right_after_in_interval == 0 and self.log.intervals[self._last_original] == k:
            self._duplicate_now(self._last_original, k)
        if k < self.config.intervals - 1 and not self._carry_next:
            self._carry_next.append(self._last_original)

    def run(self) -> Simulation:
        cfg, hub, log = self.config, self.hub, self.log
        devices = hub.devices
        D = len(devices)
        sched = self._schedule()
        bounds = cfg.interval_bounds()
        for k in range(cfg.intervals):
            n = self._steps_in(k)
            registrations = D if k == 0 else 0
            carry: dict[int, list[int]] = defaultdict(list)
            for i in self._carry_next:
                carry[self.fault_rng.randrange(n)].append(i)
            self._dup_counts["next_interval"] += len(self._carry_next)
            self._carry_next = []
            self._right_after_in_interval = 0
            for j in range(n):
                self.clock.begin_step(k, j, n)
                for i in carry.pop(j, ()):
                    log.copy_as(i, k, _DUPLICATE)
                if j < registrations:
                    hub.register(devices[j], lose_first_v0=cfg.version_gaps and j == 0)
                elif j - registrations < self.steps:
                    self._random_step()
                self._emit(k)
                for action in sched.pop((k, j), ()):
                    action()
                    self._emit(k)
            self._ensure_duplicates(k)
            self.states.append(self.fold.rows(bounds[k][1]))
        owners = [
            {"owner": o.owner, "owner_id": o.owner_id,
             "device_ids": [d.device_id for d in devices if d.owner is o]}
            for o in hub.owners
        ]
        return Simulation(
            config=cfg,
            messages=log,
            states=self.states,
            steps_per_interval=self.steps,
            owners=owners,
            gaps=hub.gaps,
            corrupt=self.corrupt,
            unregistrations=hub.unregistrations,
            duplicates=dict(self._dup_counts),
        )


def _calibrated_steps(config: SimulationConfig) -> int:
    """Steps per interval that give about ``config.target_messages`` messages.

    Runs the same config for one interval with 2000 and with 4000 steps: the difference gives the
    long-run messages per step, the rest the fixed part (registrations, scheduled faults)."""
    base = replace(config, target_messages=None, intervals=1, corrupt=0)

    def messages(steps: int) -> int:
        return len(_Generator(replace(base, steps_per_interval=steps), steps).run().messages)

    small, large = messages(2000), messages(4000)
    per_step = max(0.1, (large - small) / 2000)
    fixed = max(0.0, small - 2000 * per_step)
    assert config.target_messages is not None  # only called when it is set
    remaining = config.target_messages - fixed - config.corrupt
    return max(0, round(remaining / (config.intervals * per_step)))


def generate(config: SimulationConfig) -> Simulation:
    """Simulate plgd hub traffic for ``config`` (deterministic: same config, same bytes).

    :returns: the :class:`Simulation` (messages in publish order, expected states per interval,
        fault bookkeeping).
    :raises ValueError, TypeError: invalid config (``SimulationConfig.validate``).
    :raises RuntimeError: an interval too short for its events (see ``model.Clock``).
    """
    config.validate()
    t0 = time.perf_counter()
    steps = config.steps_per_interval if config.target_messages is None else _calibrated_steps(config)
    sim = _Generator(config, steps).run()
    sim.generation_seconds = time.perf_counter() - t0
    return sim
