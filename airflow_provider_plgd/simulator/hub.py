"""The simulated plgd hub's actions (coap-gateway + resource-aggregate + identity-store):
:class:`Hub`, over the state of :mod:`.model`, emitting logical records (``records.py``) as
docs/wire-format.md §4 says plgd does.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from ..plgd import ids
from ..plgd.pb import resourceaggregate_pb2 as pb
from .config import SimulationConfig
from .model import (
    COAPS_TCP,
    DISABLED,
    IN_SYNC,
    OFFLINE,
    ONLINE,
    OUT_OF_SYNC,
    PENDING_EVENT,
    SECOND,
    SYNCING,
    AggregateSim,
    Clock,
    DeviceSim,
    LinksSim,
    MetaSim,
    OwnerSim,
    ResourceSim,
    random_uuid,
    resource_specs,
)
from .records import EMPTY_CONTENT, Connection, IsEvent, Meta, RaEvent
from .values import cbor_content, initial_value, pending_plan, random_etag, resource_link, update_request

__all__ = ["Hub"]


class Hub:
    """The simulated hub. Actions take a device and append records to :attr:`out`.

    :param config: the simulation config (``snapshot_threshold``, interval length).
    :param rng: the traffic random generator (the only source of randomness).
    :param clock: event timestamps.
    """

    def __init__(self, config: SimulationConfig, rng: random.Random, clock: Clock) -> None:
        self.config = config
        self.rng = rng
        self.clock = clock
        self.out: list[tuple[RaEvent | IsEvent, bool, str | None]] = []
        self.gaps: list[dict[str, Any]] = []
        self.unregistrations: list[dict[str, Any]] = []
        self.hub_id = random_uuid(rng)
        self.service_ids = [random_uuid(rng) for _ in range(2)]
        self._due: list[tuple[DeviceSim, AggregateSim]] = []
        specs = resource_specs(config.resources_per_device)
        self.owners: list[OwnerSim] = []
        for i in range(config.owners):
            raw = random_uuid(rng) if (config.owners >= 2 and i == config.owners - 1) else f"owner-{i + 1}"
            client = f"172.16.{i // 250}.{i % 250 + 2}:{rng.randrange(30000, 60000)}"
            self.owners.append(OwnerSim(i, raw, ids.owner_id(raw), client))
        total = config.owners * config.devices_per_owner
        self.devices: list[DeviceSim] = []
        for o in self.owners:
            for _ in range(config.devices_per_owner):
                n = len(self.devices)
                old_hub = config.old_hub_snapshots and (n % 4 == 1 or total == 1)
                endpoint = f"coaps+tcp://10.{n // 250 % 250}.{n % 250}.{rng.randrange(2, 250)}:5684"
                self.devices.append(
                    DeviceSim(o, n, random_uuid(rng), specs, old_hub, n % 3 == 2, random_uuid(rng), endpoint)
                )

    # ---- emission helpers -----------------------------------------------------------------

    def _flush_snapshots(self) -> None:
        due, self._due = self._due, []
        for dev, agg in due:
            agg.snapshot_due = False
            self._snapshot(dev, agg)

    def _now(self) -> int:
        """Next event timestamp, after any due old-hub snapshot (so publish order = time order)."""
        if self._due:
            self._flush_snapshots()
        return self.clock.tick()

    def drain(self) -> list[tuple[RaEvent | IsEvent, bool, str | None]]:
        """Return and clear the records emitted so far (pending old-hub snapshots included)."""
        self._flush_snapshots()
        out, self.out = self.out, []
        return out

    def _ra(self, dev: DeviceSim, agg: AggregateSim, event_type: str, href: str | None, fields: dict[str, Any], *,
            conn: str, seq: int, corr: str = "", user: str | None = None, ts: int | None = None,
            published: bool = True, fault: str | None = None) -> RaEvent:
        if self._due:
            self._flush_snapshots()
        agg.version += 1
        owner = dev.owner
        meta = Meta(agg.version, self.clock.tick() if ts is None else ts, conn, seq,
                    owner.owner if user is None else user, corr, owner.owner, self.hub_id)
        rec = RaEvent(event_type, owner.owner_id, dev.device_id, href, meta, fields)
        self.out.append((rec, published, fault))
        if not published:
            agg.gapped = True
        elif dev.old_hub and fault is None and not agg.gapped:
            agg.since_snapshot += 1
            if agg.since_snapshot >= self.config.snapshot_threshold:
                agg.since_snapshot = 0
                agg.snapshot_due = True
                self._due.append((dev, agg))
        return rec

    def _snapshot(self, dev: DeviceSim, agg: AggregateSim) -> None:
        fields: dict[str, Any]
        conn = dev.conn.id if dev.conn else ""
        if isinstance(agg, ResourceSim):
            fields = {"latest": agg.latest, "pendings": {k: tuple(v) for k, v in agg.pendings.items()},
                      "types": agg.types}
            self._ra(dev, agg, "resourcestatesnapshottaken", agg.href, fields, conn=conn, seq=0,
                     fault="old_hub_snapshot")
        elif isinstance(agg, LinksSim):
            self._ra(dev, agg, "resourcelinkssnapshottaken", None, {"links": dict(agg.links)}, conn=conn, seq=0,
                     fault="old_hub_snapshot")
        else:
            assert isinstance(agg, MetaSim)
            fields = {"updated": agg.updated, "pendings": tuple(agg.pendings)}
            self._ra(dev, agg, "devicemetadatasnapshottaken", None, fields, conn=conn, seq=0,
                     fault="old_hub_snapshot")

    def _is(self, owner: OwnerSim, event_type: str, device_ids: tuple[str, ...]) -> None:
        if self._due:
            self._flush_snapshots()
        rec = IsEvent(event_type, owner.owner_id, owner.owner, device_ids, self.clock.tick(), owner.owner, self.hub_id)
        self.out.append((rec, True, None))

    # ---- device lifecycle -----------------------------------------------------------------

    def register(self, dev: DeviceSim, *, lose_first_v0: bool = False) -> None:
        """Sign-up and first sign-in: ``devicesregistered``, metadata ONLINE, links (version 0),
        twin SYNCING, one ``resourcechanged`` per resource, twin IN_SYNC. With ``lose_first_v0``
        the first resource's version-0 ``resourcechanged`` is not published (publish failure,
        §4.8) and a version-1 change follows."""
        dev.new_incarnation()
        dev.registered = True
        self._is(dev.owner, "devicesregistered", (dev.device_id,))
        self._connect(dev)
        for res in dev.resources.values():
            res.published = True
        links = tuple(resource_link(dev, r) for r in dev.resources.values())
        dev.links.links = {link.href: link for link in links}
        self._ra(dev, dev.links, "resourcelinkspublished", None, {"links": links}, conn=dev.conn_id,
                 seq=dev.next_seq())
        self._sync_start(dev)
        for i, res in enumerate(dev.resources.values()):
            res.value = initial_value(self.rng, dev, res)
            lost = lose_first_v0 and i == 0
            self._changed(dev, res, published=not lost)
            if lost:
                self.gaps.append({"device_id": dev.device_id, "href": res.href,
                                  "aggregate_id": ids.resource_aggregate_id(dev.device_id, res.href),
                                  "first": 0, "last": 0, "reason": "lost_publish"})
                res.value = {**res.value, **update_request(self.rng, res)}
                self._changed(dev, res)
        self._sync_done(dev)

    def _last_is_event(self) -> IsEvent:
        rec = self.out[-1][0]
        assert isinstance(rec, IsEvent)
        return rec

    def unregister(self, dev: DeviceSim) -> None:
        """Device deleted: RA store wiped (no RA event), then IS ``devicesunregistered`` (§4.7)."""
        self._is(dev.owner, "devicesunregistered", (dev.device_id,))
        self.unregistrations.append({"device_id": dev.device_id, "owner_id": dev.owner.owner_id,
                                     "interval": self.clock.k, "timestamp": self._last_is_event().timestamp})
        dev.registered = False
        dev.online = False
        dev.confirmable = []

    def unregister_nothing(self, owner: OwnerSim) -> None:
        """A ``devicesunregistered`` with an empty device list (published unconditionally, §3.4)."""
        self._is(owner, "devicesunregistered", ())

    def _metadata_fields(self, dev: DeviceSim) -> dict[str, Any]:
        return {"connection": dev.conn, "twin": dev.twin, "twin_enabled": dev.twin_enabled, "canceled": False}

    def _updated(self, dev: DeviceSim, *, conn: str, seq: int, corr: str = "", user: str | None = None,
                 ts: int | None = None) -> RaEvent:
        rec = self._ra(dev, dev.meta, "devicemetadataupdated", None, self._metadata_fields(dev), conn=conn, seq=seq,
                       corr=corr, user=user, ts=ts)
        dev.meta.updated = rec
        if corr:
            dev.meta.pendings = [p for p in dev.meta.pendings if p.meta.correlation_id != corr]
        return rec

    def _connect(self, dev: DeviceSim) -> None:
        ts = self._now()
        rng = self.rng
        conn_id = f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}:{rng.randrange(1024, 65536)}"
        local = (dev.endpoint, f"coap+tcp://[fe80::{dev.index % 65536:x}]:5683")
        dev.conn = Connection(ONLINE, conn_id, ts, COAPS_TCP, rng.choice(self.service_ids), local)
        dev.twin = replace(dev.twin, state=OUT_OF_SYNC if dev.twin_enabled else DISABLED)
        dev.seq = rng.randrange(1, 100)
        dev.online = True
        self._updated(dev, conn=conn_id, seq=dev.next_seq(), ts=ts)

    def _disconnect(self, dev: DeviceSim, *, heartbeat: bool) -> None:
        c = dev.conn
        assert c is not None
        dev.conn = Connection(OFFLINE, c.id, c.connected_at, c.protocol, "", c.local_endpoints)
        dev.twin = replace(dev.twin, state=OUT_OF_SYNC if dev.twin_enabled else DISABLED)
        dev.online = False
        self._updated(dev, conn=c.id, seq=dev.next_seq(), user=ids.NIL_UUID if heartbeat else None)

    def _sync_start(self, dev: DeviceSim) -> None:
        if not dev.twin_enabled:
            return
        ts = self._now()
        seq = dev.next_seq()
        dev.twin = replace(dev.twin, state=SYNCING, syncing_at=ts, cm_connection_id=dev.conn_id, cm_sequence=seq)
        self._updated(dev, conn=dev.conn_id, seq=seq, ts=ts)

    def _sync_done(self, dev: DeviceSim) -> None:
        if not dev.twin_enabled:
            return
        ts = self._now()
        seq = dev.next_seq()
        dev.twin = replace(dev.twin, state=IN_SYNC, in_sync_at=ts, cm_connection_id=dev.conn_id, cm_sequence=seq)
        self._updated(dev, conn=dev.conn_id, seq=seq, ts=ts)

    def reconnect(self, dev: DeviceSim) -> None:
        """Online device: goes OFFLINE (sign-out, or heartbeat expiry with the nil user ID), and
        usually signs in again at once with a new connection ID (then twin sync). Offline device:
        signs in."""
        if dev.online:
            self._disconnect(dev, heartbeat=self.rng.random() < 0.3)
            if self.rng.random() < 0.3:
                return  # stays offline for a while
        self._connect(dev)
        self._sync_start(dev)
        self._sync_done(dev)

    # ---- resources ------------------------------------------------------------------------

    def _changed(self, dev: DeviceSim, res: ResourceSim, *, published: bool = True) -> None:
        res.etag = random_etag(self.rng)
        fields = {"content": cbor_content(res.value), "status": pb.OK, "etag": res.etag, "types": res.types}
        res.latest = self._ra(dev, res, "resourcechanged", res.href, fields, conn=dev.conn_id, seq=dev.next_seq(),
                              published=published)

    def notify(self, dev: DeviceSim, res: ResourceSim) -> None:
        """The device reports a new representation (always different from the latest)."""
        res.value = {**res.value, **update_request(self.rng, res)}
        self._changed(dev, res)

    def command(self, dev: DeviceSim, res: ResourceSim, kind: str, *, confirm_now: bool = False) -> None:
        """A create/retrieve/update/delete command through the API: the pending event, then per
        :func:`.values.pending_plan` (or at once with ``confirm_now``) the device's confirmation now, later,
        or never."""
        ts = self._now()
        variant, valid_until = pending_plan(self.rng, self.clock, ts)
        if confirm_now:
            variant = "now"
        corr = random_uuid(self.rng)
        fields: dict[str, Any] = {"valid_until": valid_until, "types": res.types}
        if kind == "update":
            request = update_request(self.rng, res)
            res.requests[corr] = request
            fields.update(content=cbor_content(request), interface="oic.if.a" if res.spec.kind != "device" else "")
        elif kind == "retrieve":
            fields.update(interface="", etags=(res.etag,) if res.etag else ())
        elif kind == "create":
            fields["content"] = cbor_content({"rt": ["oic.r.switch.binary"], "if": ["oic.if.a", "oic.if.baseline"],
                                                "rep": {"value": False}})
        else:
            fields["interface"] = ""
        rec = self._ra(dev, res, PENDING_EVENT[kind], res.href, fields, conn=dev.owner.client_conn, seq=0, corr=corr,
                       ts=ts)
        res.pendings[kind].append(rec)
        if variant == "now":
            self._confirm(dev, res, kind, rec)
        elif variant == "later":
            dev.confirmable.append((res.href, kind, corr))

    def _confirm(self, dev: DeviceSim, res: ResourceSim, kind: str, pending: RaEvent) -> None:
        corr = pending.meta.correlation_id
        types = res.types
        new_value = None
        if kind == "update":
            request = res.requests.pop(corr, {})
            new_value = {**res.value, **request}
            fields = {"status": pb.OK, "content": cbor_content(new_value), "types": types}
        elif kind == "retrieve":
            assert res.latest is not None  # a published resource has had a resourcechanged
            fields = {"status": pb.OK, "content": res.latest.fields["content"], "etag": res.etag, "types": types}
        elif kind == "create":
            fields = {"status": pb.CREATED, "content": cbor_content({"href": f"{res.href}/{self.rng.randrange(1, 99)}"}),
                      "types": types}
        else:
            ok = self.rng.random() < 0.5
            fields = {"status": pb.OK if ok else pb.FORBIDDEN, "content": EMPTY_CONTENT, "types": types}
        event_type = {"update": "resourceupdated", "retrieve": "resourceretrieved", "create": "resourcecreated",
                      "delete": "resourcedeleted"}[kind]
        self._ra(dev, res, event_type, res.href, fields, conn=dev.conn_id, seq=dev.next_seq(), corr=corr)
        if kind == "delete" and fields["status"] == pb.OK:
            for lst in res.pendings.values():
                lst.clear()
            res.requests.clear()
            dev.confirmable = [c for c in dev.confirmable if c[0] != res.href]
        else:
            lst = res.pendings[kind]
            lst.remove(pending)
        if new_value is not None and new_value != res.value:
            res.value = new_value
            self._changed(dev, res)

    def confirm_late(self, dev: DeviceSim) -> bool:
        """Confirm one pending that was left for later (device online, resource published, not
        expired). Returns False when there is none."""
        now = self.clock.cur
        i = 0
        while i < len(dev.confirmable):
            href, kind, corr = dev.confirmable[i]
            res = None
            if href is None:
                pending = next((p for p in dev.meta.pendings if p.meta.correlation_id == corr), None)
            else:
                res = dev.resources[href]
                if not res.published:
                    i += 1
                    continue
                pending = next((p for p in res.pendings[kind] if p.meta.correlation_id == corr), None)
            del dev.confirmable[i]
            if pending is None:
                continue
            valid_until = pending.fields["valid_until"]
            if valid_until and valid_until <= now:
                continue
            if res is None:
                self._confirm_metadata(dev, pending)
            else:
                self._confirm(dev, res, kind, pending)
            return True
        return False

    def links_title(self, dev: DeviceSim, res: ResourceSim) -> None:
        """The device republishes one link with a new title (a changed link, §4.5)."""
        res.title_rev += 1
        link = resource_link(dev, res)
        dev.links.links[res.href] = link
        self._ra(dev, dev.links, "resourcelinkspublished", None, {"links": (link,)}, conn=dev.conn_id,
                 seq=dev.next_seq())

    def unpublish(self, dev: DeviceSim, res: ResourceSim) -> None:
        """``resourcelinksunpublished`` [href], then the RA's ``resourcechanged`` NOT_FOUND with the
        unpublish command's metadata (§4.4)."""
        seq = dev.next_seq()
        conn = dev.conn_id
        self._ra(dev, dev.links, "resourcelinksunpublished", None, {"hrefs": (res.href,)}, conn=conn, seq=seq)
        del dev.links.links[res.href]
        res.published = False
        res.etag = b""
        fields = {"content": EMPTY_CONTENT, "status": pb.NOT_FOUND, "etag": b"", "types": res.types}
        res.latest = self._ra(dev, res, "resourcechanged", res.href, fields, conn=conn, seq=seq)

    def republish(self, dev: DeviceSim, res: ResourceSim) -> None:
        """The link comes back, then the device reports the resource's content."""
        link = resource_link(dev, res)
        dev.links.links[res.href] = link
        res.published = True
        self._ra(dev, dev.links, "resourcelinkspublished", None, {"links": (link,)}, conn=dev.conn_id,
                 seq=dev.next_seq())
        self.notify(dev, res)

    def forced_update_on_unpublished(self, dev: DeviceSim, res: ResourceSim) -> None:
        """Version gap (§3.1*): a forced update on an unpublished resource; its pending event
        consumes a version but is not published; the confirmation (NOT_FOUND) is."""
        if res.published:
            self.unpublish(dev, res)
        ts = self._now()
        corr = random_uuid(self.rng)
        request = update_request(self.rng, res) if res.value else {"value": True}
        fields = {"content": cbor_content(request), "interface": "", "valid_until": ts + 10 * SECOND,
                  "types": res.types}
        rec = self._ra(dev, res, "resourceupdatepending", res.href, fields, conn=dev.owner.client_conn, seq=0,
                       corr=corr, ts=ts, published=False)
        self.gaps.append({"device_id": dev.device_id, "href": res.href,
                          "aggregate_id": ids.resource_aggregate_id(dev.device_id, res.href),
                          "first": rec.meta.version, "last": rec.meta.version, "reason": "forced_pending_unpublished"})
        res.pendings["update"].append(rec)
        fields = {"status": pb.NOT_FOUND, "content": EMPTY_CONTENT, "types": res.types}
        self._ra(dev, res, "resourceupdated", res.href, fields, conn=dev.conn_id, seq=dev.next_seq(), corr=corr)
        res.pendings["update"].remove(rec)

    # ---- device metadata commands ---------------------------------------------------------

    def has_open_metadata_command(self, dev: DeviceSim) -> bool:
        return any(href is None for href, _, _ in dev.confirmable)

    def metadata_command(self, dev: DeviceSim, *, force_sync: bool, confirm_now: bool = False) -> None:
        """``devicemetadataupdatepending`` (toggle twin_enabled, or force a twin sync), then the
        confirming ``devicemetadataupdated`` now, later, or never (:func:`.values.pending_plan`, or at once
        with ``confirm_now``)."""
        ts = self._now()
        variant, valid_until = pending_plan(self.rng, self.clock, ts)
        if confirm_now:
            variant = "now"
        corr = random_uuid(self.rng)
        if force_sync:
            fields = {"twin_enabled": None, "twin_force_synchronization": True, "valid_until": valid_until}
        else:
            fields = {"twin_enabled": not dev.twin_enabled, "twin_force_synchronization": None,
                      "valid_until": valid_until}
        rec = self._ra(dev, dev.meta, "devicemetadataupdatepending", None, fields, conn=dev.owner.client_conn, seq=0,
                       corr=corr, ts=ts)
        dev.meta.pendings.append(rec)
        if variant == "now":
            self._confirm_metadata(dev, rec)
        elif variant == "later":
            dev.confirmable.append((None, "twin_force_synchronization" if force_sync else "twin_enabled", corr))

    def _confirm_metadata(self, dev: DeviceSim, pending: RaEvent) -> None:
        corr = pending.meta.correlation_id
        ts = self._now()
        if pending.fields["twin_force_synchronization"]:
            dev.twin_enabled = True
            dev.twin = replace(dev.twin, state=OUT_OF_SYNC, force_synchronization_at=ts)
        else:
            dev.twin_enabled = pending.fields["twin_enabled"]
            dev.twin = replace(dev.twin, state=OUT_OF_SYNC if dev.twin_enabled else DISABLED)
        self._updated(dev, conn=dev.conn_id, seq=dev.next_seq(), corr=corr, ts=ts)
        if dev.twin_enabled:
            self._sync_start(dev)
            self._sync_done(dev)
