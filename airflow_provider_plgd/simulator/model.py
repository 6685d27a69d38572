"""Hub-side state: the devices, owners and aggregates of the simulated plgd hub, and its clock
(:mod:`.hub` holds the actions, :class:`~.hub.Hub`).

:class:`~.hub.Hub` keeps the resource-aggregate's write-side state per aggregate (versions, latest
content, pendings, links, device metadata) and only emits events plgd would emit
(docs/wire-format.md §4): every ``resourcechanged`` differs from the latest one and comes from the
device's connection with a strictly increasing sequence (§4.4 stale-skip); confirmations match
an open pending's correlation ID; a forced command on an unpublished resource consumes a version
without being published (§3.1*); devices re-created after ``devicesunregistered`` restart every
aggregate at version 0 (§4.2, §4.7); old-hub devices publish ``*snapshottaken`` events with their
own version after every ``snapshot_threshold`` events (§4.2).

Each action appends ``(record, published, fault)`` to :attr:`.hub.Hub.out`; the generator drains it.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from typing import Any

from ..plgd.pb import resourceaggregate_pb2 as pb
from .config import SimulationConfig
from .records import Connection, Link, RaEvent, TwinSync

__all__ = ["CBOR_CONTENT_FORMAT", "CBOR_CONTENT_TYPE", "Clock", "DeviceSim", "OwnerSim", "ResourceSpec", "resource_specs"]

CBOR_CONTENT_TYPE = "application/vnd.ocf+cbor"
CBOR_CONTENT_FORMAT = 10000

OFFLINE, ONLINE = pb.Connection.OFFLINE, pb.Connection.ONLINE
COAPS_TCP = pb.Connection.COAPS_TCP
OUT_OF_SYNC, DISABLED, SYNCING, IN_SYNC = (
    pb.TwinSynchronization.OUT_OF_SYNC,
    pb.TwinSynchronization.DISABLED,
    pb.TwinSynchronization.SYNCING,
    pb.TwinSynchronization.IN_SYNC,
)
PENDING_EVENT = {
    "create": "resourcecreatepending",
    "retrieve": "resourceretrievepending",
    "update": "resourceupdatepending",
    "delete": "resourcedeletepending",
}
SECOND = 1_000_000_000


@dataclass(frozen=True)
class ResourceSpec:
    """A simulated resource kind: href, resource types, interfaces, link title, content kind."""

    href: str
    kind: str  # "light" | "device" | "switch"
    types: tuple[str, ...]
    interfaces: tuple[str, ...]
    title: str


def resource_specs(count: int) -> list[ResourceSpec]:
    """The first ``count`` resources of a device: ``/light/1``, ``/oic/d``, ``/switches/1``,
    ``/light/2``, ``/light/3``, ..."""
    base = [
        ResourceSpec("/light/1", "light", ("core.light",), ("oic.if.baseline", "oic.if.a"), "Light 1"),
        ResourceSpec("/oic/d", "device", ("oic.wk.d",), ("oic.if.baseline", "oic.if.r"), "Device"),
        ResourceSpec("/switches/1", "switch", ("oic.r.switch.binary",), ("oic.if.baseline", "oic.if.a"), "Switch 1"),
    ]
    specs = base[:count]
    for n in range(2, count - len(base) + 2):
        specs.append(ResourceSpec(f"/light/{n}", "light", ("core.light",), ("oic.if.baseline", "oic.if.a"), f"Light {n}"))
    return specs


def random_uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


class Clock:
    """Event timestamps: strictly increasing, inside the current interval (unix ns).

    Step ``j`` of ``n`` in interval ``k`` starts at
    ``start + k*interval + j*(interval//n) + jitter`` (jitter < a quarter slot); events in a step
    follow at ``spacing`` ns. Raises RuntimeError if an interval cannot hold its events.
    """

    def __init__(self, config: SimulationConfig, rng: random.Random) -> None:
        self.start = config.start_time_ns
        self.interval = config.interval_ns
        self.rng = rng
        self.k = 0
        self.end = self.start + self.interval
        self.cur = self.start
        self.spacing = 1

    def begin_step(self, k: int, j: int, n: int) -> None:
        self.k = k
        self.end = self.start + (k + 1) * self.interval
        slot = self.interval // max(n, 1)
        base = self.start + k * self.interval + j * slot + self.rng.randrange(max(1, slot // 4))
        self.cur = max(self.cur, base)
        self.spacing = max(1, min(SECOND // 1000, slot // 64))

    def tick(self) -> int:
        t = self.cur
        if t >= self.end:
            raise RuntimeError(
                f"interval {self.k} cannot hold its events: timestamp {t} reached the interval end "
                f"{self.end}; use a longer interval_seconds or fewer steps_per_interval"
            )
        self.cur = t + self.spacing
        return t


class AggregateSim:
    """Write-side bookkeeping shared by the three aggregate kinds."""

    __slots__ = ("gapped", "since_snapshot", "snapshot_due", "version")

    def __init__(self) -> None:
        self.version = -1
        self.since_snapshot = 0
        self.gapped = False
        self.snapshot_due = False


class ResourceSim(AggregateSim):
    """One resource aggregate (one incarnation)."""

    __slots__ = ("etag", "latest", "pendings", "published", "requests", "spec", "title_rev", "types", "value")

    def __init__(self, spec: ResourceSpec, types: tuple[str, ...]) -> None:
        super().__init__()
        self.spec = spec
        self.types = types
        self.value: dict[str, Any] = {}
        self.latest: RaEvent | None = None
        self.etag = b""
        self.pendings: dict[str, list[RaEvent]] = {"create": [], "retrieve": [], "update": [], "delete": []}
        self.requests: dict[str, dict[str, Any]] = {}
        self.published = False
        self.title_rev = 0

    @property
    def href(self) -> str:
        return self.spec.href


class LinksSim(AggregateSim):
    __slots__ = ("links",)

    def __init__(self) -> None:
        super().__init__()
        self.links: dict[str, Link] = {}


class MetaSim(AggregateSim):
    __slots__ = ("pendings", "updated")

    def __init__(self) -> None:
        super().__init__()
        self.updated: RaEvent | None = None
        self.pendings: list[RaEvent] = []


@dataclass
class OwnerSim:
    """An owner: raw claim value, its subject token, and the API client's gRPC peer address."""

    index: int
    owner: str
    owner_id: str
    client_conn: str


class DeviceSim:
    """One device and its three kinds of aggregates (replaced on re-creation)."""

    def __init__(self, owner: OwnerSim, index: int, device_id: str, specs: list[ResourceSpec], old_hub: bool,
                 untyped_switch: bool, piid: str, endpoint: str) -> None:
        self.owner = owner
        self.index = index
        self.device_id = device_id
        self.specs = specs
        self.old_hub = old_hub
        self.untyped_switch = untyped_switch
        self.piid = piid
        self.endpoint = endpoint
        self.registered = False
        self.online = False
        self.incarnation = 0
        self.conn: Connection | None = None
        self.twin = TwinSync(OUT_OF_SYNC, 0, 0, "", 0, 0)
        self.twin_enabled = True
        self.seq = 0
        self.resources: dict[str, ResourceSim] = {}
        self.links = LinksSim()
        self.meta = MetaSim()
        self.confirmable: list[tuple[str | None, str, str]] = []  # (href or None, kind, correlation id)

    def new_incarnation(self) -> None:
        self.incarnation += 1
        self.resources = {
            s.href: ResourceSim(s, () if (s.kind == "switch" and self.untyped_switch) else s.types)
            for s in self.specs
        }
        self.links = LinksSim()
        self.meta = MetaSim()
        self.conn = None
        self.twin = TwinSync(OUT_OF_SYNC, 0, 0, "", 0, 0)
        self.twin_enabled = True
        self.online = False
        self.confirmable = []

    @property
    def conn_id(self) -> str:
        """The ID of the device's current (or last) connection; only asked once it has one."""
        assert self.conn is not None, f"device {self.device_id} never connected"
        return self.conn.id

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def published_resources(self) -> list[ResourceSim]:
        return [r for r in self.resources.values() if r.published]

    def aggregates(self) -> list[AggregateSim]:
        return [self.links, self.meta, *self.resources.values()]
