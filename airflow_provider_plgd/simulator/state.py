"""Expected state: the published events folded per docs/wire-format.md §4 and §4.9.

:class:`StateFold` applies the simulator's own logical records (``records.py``) of every
*published* event, in publish order (which is version order per aggregate), exactly as plgd's
resource-aggregate model would see them arrive from NATS; it never decodes bytes. At the end of
each interval the generator calls :meth:`StateFold.rows` with the interval end as snapshot time.

Rules (the same ones ``docs/data-contracts.md`` gives the Spark rebuild):

* resource aggregate (§4.4): ``resourcechanged`` becomes the latest content; ``*pending`` is
  appended to its list; ``resourcecreated/updated/retrieved`` remove the first pending of their
  type with the same ``audit_context.correlation_id``; ``resourcedeleted`` with status OK or
  ACCEPTED clears all four lists, otherwise removes the matching delete pending;
  ``resourcestatesnapshottaken`` replaces the state. ``resource_types`` = the last non-empty
  types of any event.
* links aggregate (§4.5): published upserts by href, unpublished removes the hrefs (an empty list
  removes all), snapshot replaces the map.
* metadata aggregate (§4.6): ``devicemetadataupdated`` is the full connection/twin state and
  resolves the pending with its correlation ID; ``devicemetadataupdatepending`` is appended;
  snapshot replaces both. Before any update, ``twin_enabled`` is true.
* identity store (§4.7): ``devicesregistered`` adds (owner, device); ``devicesunregistered``
  drops every row of the device (all four tables) and forgets its aggregates, so the next
  incarnation starts from version 0.
* versions (§4.9 rule 7): a first event with version v > 0 records the missing range [0, v-1];
  a jump from v to w > v+1 records [v+1, w-1]; ``complete`` = no missing range. A
  ``*snapshottaken`` event is a full base: it clears the missing ranges.
* pendings with ``valid_until != 0 and valid_until < snapshot_time`` are left out of the rows.
"""

from __future__ import annotations

import base64
import copy
from typing import Any

from ..plgd import ids
from ..plgd.content import content_to_json
from ..plgd.pb import resourceaggregate_pb2 as pb
from ..plgd.tables import SNAPSHOT_SORT_KEYS
from .records import IsEvent, RaEvent

__all__ = ["StateFold", "expected_state"]

_STATUS_NAME = {v.number: v.name for v in pb.Status.DESCRIPTOR.values}
_CONN_STATUS_NAME = {v.number: v.name for v in pb.Connection.Status.DESCRIPTOR.values}
_PROTOCOL_NAME = {v.number: v.name for v in pb.Connection.Protocol.DESCRIPTOR.values}
_TWIN_STATE_NAME = {v.number: v.name for v in pb.TwinSynchronization.State.DESCRIPTOR.values}

PENDING_KINDS = ("create", "retrieve", "update", "delete")
_PENDING_OF = {
    "resourcecreatepending": "create",
    "resourceretrievepending": "retrieve",
    "resourceupdatepending": "update",
    "resourcedeletepending": "delete",
}
_CONFIRM_OF = {"resourcecreated": "create", "resourceretrieved": "retrieve", "resourceupdated": "update"}
_DELETE_CLEARS = (pb.OK, pb.ACCEPTED)


class _Aggregate:
    __slots__ = ("aggregate_id", "device_id", "missing", "owner_id", "timestamp", "version")

    def __init__(self, owner_id: str, device_id: str, aggregate_id: str) -> None:
        self.owner_id = owner_id
        self.device_id = device_id
        self.aggregate_id = aggregate_id
        self.version = -1
        self.timestamp = 0
        self.missing: list[tuple[int, int]] = []

    def advance(self, version: int, timestamp: int, snapshot: bool) -> None:
        if version <= self.version:
            raise RuntimeError(
                f"simulator bug: aggregate {self.aggregate_id} got version {version} after {self.version}"
            )
        if snapshot:
            self.missing = []
        elif version > self.version + 1:
            self.missing.append((self.version + 1, version - 1))
        self.version = version
        self.timestamp = timestamp

    def tail(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "timestamp": self.timestamp,
            "complete": not self.missing,
            "missing_versions": [{"first": a, "last": b} for a, b in self.missing],
        }


class _ResourceAgg(_Aggregate):
    __slots__ = ("href", "latest", "pendings", "types")

    def __init__(self, owner_id: str, device_id: str, href: str) -> None:
        super().__init__(owner_id, device_id, ids.resource_aggregate_id(device_id, href))
        self.href = href
        self.latest: RaEvent | None = None
        self.types: tuple[str, ...] = ()
        self.pendings: dict[str, list[RaEvent]] = {k: [] for k in PENDING_KINDS}


class _LinksAgg(_Aggregate):
    __slots__ = ("links",)

    def __init__(self, owner_id: str, device_id: str) -> None:
        super().__init__(owner_id, device_id, ids.links_aggregate_id(device_id))
        self.links: dict[str, tuple[Any, int, int]] = {}  # href -> (Link, version, timestamp)


class _MetadataAgg(_Aggregate):
    __slots__ = ("pendings", "updated")

    def __init__(self, owner_id: str, device_id: str) -> None:
        super().__init__(owner_id, device_id, ids.metadata_aggregate_id(device_id))
        self.updated: RaEvent | None = None
        self.pendings: list[RaEvent] = []


def _remove_first(pendings: list[RaEvent], correlation_id: str) -> None:
    for i, p in enumerate(pendings):
        if p.meta.correlation_id == correlation_id:
            del pendings[i]
            return


def _open(valid_until: int, snapshot_time: int) -> bool:
    return valid_until == 0 or valid_until >= snapshot_time


class StateFold:
    """Folds published records into the four snapshot tables (see the module docstring)."""

    def __init__(self) -> None:
        self.resources: dict[tuple[str, str], _ResourceAgg] = {}
        self.links: dict[str, _LinksAgg] = {}
        self.metadata: dict[str, _MetadataAgg] = {}
        self.owner_devices: dict[str, tuple[str, str, int]] = {}  # device -> (owner_id, owner, at)

    # ---- applying events ------------------------------------------------------------------

    def apply(self, record: RaEvent | IsEvent) -> None:
        """Apply one published event. Raises RuntimeError if versions go backwards (a bug)."""
        if isinstance(record, IsEvent):
            self._apply_is(record)
            return
        et = record.event_type
        if record.href is not None:
            self._apply_resource(record, et)
        elif et.startswith("resourcelinks"):
            self._apply_links(record, et)
        else:
            self._apply_metadata(record, et)

    def _apply_is(self, r: IsEvent) -> None:
        if r.event_type == "devicesregistered":
            for d in r.device_ids:
                self.owner_devices[d] = (r.owner_id, r.owner, r.timestamp)
            return
        for d in r.device_ids:
            self.owner_devices.pop(d, None)
            self.links.pop(d, None)
            self.metadata.pop(d, None)
            for key in [k for k in self.resources if k[0] == d]:
                del self.resources[key]

    def _apply_resource(self, r: RaEvent, et: str) -> None:
        href = r.href
        assert href is not None  # resource events carry their href
        key = (r.device_id, href)
        agg = self.resources.get(key)
        if agg is None:
            agg = self.resources[key] = _ResourceAgg(r.owner_id, r.device_id, href)
        f = r.fields
        snapshot = et == "resourcestatesnapshottaken"
        agg.advance(r.meta.version, r.meta.timestamp, snapshot)
        if f.get("types"):
            agg.types = f["types"]
        if et == "resourcechanged":
            agg.latest = r
        elif et in _PENDING_OF:
            agg.pendings[_PENDING_OF[et]].append(r)
        elif et in _CONFIRM_OF:
            _remove_first(agg.pendings[_CONFIRM_OF[et]], r.meta.correlation_id)
        elif et == "resourcedeleted":
            if f["status"] in _DELETE_CLEARS:
                for lst in agg.pendings.values():
                    lst.clear()
            else:
                _remove_first(agg.pendings["delete"], r.meta.correlation_id)
        elif snapshot:
            agg.latest = f["latest"]
            agg.pendings = {k: list(f["pendings"][k]) for k in PENDING_KINDS}
        else:
            raise RuntimeError(f"simulator bug: unexpected resource event type {et!r}")

    def _apply_links(self, r: RaEvent, et: str) -> None:
        agg = self.links.get(r.device_id)
        if agg is None:
            agg = self.links[r.device_id] = _LinksAgg(r.owner_id, r.device_id)
        v, ts = r.meta.version, r.meta.timestamp
        agg.advance(v, ts, et == "resourcelinkssnapshottaken")
        if et == "resourcelinkspublished":
            for link in r.fields["links"]:
                agg.links[link.href] = (link, v, ts)
        elif et == "resourcelinksunpublished":
            hrefs = r.fields["hrefs"]
            if not hrefs:
                agg.links.clear()
            for href in hrefs:
                agg.links.pop(href, None)
        else:
            agg.links = {href: (link, v, ts) for href, link in r.fields["links"].items()}

    def _apply_metadata(self, r: RaEvent, et: str) -> None:
        agg = self.metadata.get(r.device_id)
        if agg is None:
            agg = self.metadata[r.device_id] = _MetadataAgg(r.owner_id, r.device_id)
        agg.advance(r.meta.version, r.meta.timestamp, et == "devicemetadatasnapshottaken")
        if et == "devicemetadataupdated":
            agg.updated = r
            if r.meta.correlation_id:
                _remove_first(agg.pendings, r.meta.correlation_id)
        elif et == "devicemetadataupdatepending":
            agg.pendings.append(r)
        else:
            agg.updated = r.fields["updated"]
            agg.pendings = list(r.fields["pendings"])

    # ---- rows -----------------------------------------------------------------------------

    def rows(self, snapshot_time: int) -> dict[str, list[dict[str, Any]]]:
        """The four tables as lists of row dicts (columns per ``tables.SNAPSHOT_TABLES``), sorted
        by ``tables.SNAPSHOT_SORT_KEYS``, with pendings expired at ``snapshot_time`` (unix ns)
        left out."""
        out = {
            "resources": [self._resource_row(a, snapshot_time) for a in self.resources.values()],
            "device_metadata": [self._metadata_row(a, snapshot_time) for a in self.metadata.values()],
            "device_links": [row for a in self.links.values() for row in self._link_rows(a)],
            "owner_devices": [
                {"owner_id": o, "owner": raw, "device_id": d, "registered_at": at}
                for d, (o, raw, at) in self.owner_devices.items()
            ],
        }
        for table, keys in SNAPSHOT_SORT_KEYS.items():
            out[table].sort(key=lambda row: tuple(row[k] for k in keys))
        return out

    @staticmethod
    def _resource_row(a: _ResourceAgg, t: int) -> dict[str, Any]:
        latest = a.latest
        row: dict[str, Any] = {
            "owner_id": a.owner_id,
            "device_id": a.device_id,
            "href": a.href,
            "aggregate_id": a.aggregate_id,
            "resource_types": list(a.types),
            "status": None,
            "content_type": None,
            "coap_content_format": None,
            "content_json": None,
            "etag": None,
        }
        if latest is not None:
            f = latest.fields
            c = f["content"]
            row["status"] = _STATUS_NAME[f["status"]]
            row["content_type"] = c.content_type
            row["coap_content_format"] = c.coap_content_format
            row["content_json"] = content_to_json(c.data, c.content_type, c.coap_content_format)
            row["etag"] = base64.b64encode(f["etag"]).decode("ascii") if f["etag"] else None
        for kind in PENDING_KINDS:
            row[f"{kind}_pendings"] = [
                {
                    "correlation_id": p.meta.correlation_id,
                    "valid_until": p.fields["valid_until"],
                    "version": p.meta.version,
                    "timestamp": p.meta.timestamp,
                }
                for p in a.pendings[kind]
                if _open(p.fields["valid_until"], t)
            ]
        row.update(a.tail())
        return row

    @staticmethod
    def _metadata_row(a: _MetadataAgg, t: int) -> dict[str, Any]:
        row: dict[str, Any] = {
            "owner_id": a.owner_id,
            "device_id": a.device_id,
            "aggregate_id": a.aggregate_id,
            "connection_status": None,
            "connection_id": None,
            "connected_at": None,
            "connection_protocol": None,
            "service_id": None,
            "local_endpoints": None,
            "twin_enabled": True,
            "twin_synchronization_state": None,
            "twin_syncing_at": None,
            "twin_in_sync_at": None,
            "twin_force_synchronization_at": None,
        }
        if a.updated is not None:
            f = a.updated.fields
            c, tw = f["connection"], f["twin"]
            row.update(
                connection_status=_CONN_STATUS_NAME[c.status],
                connection_id=c.id,
                connected_at=c.connected_at,
                connection_protocol=_PROTOCOL_NAME[c.protocol],
                service_id=c.service_id,
                local_endpoints=list(c.local_endpoints),
                twin_enabled=f["twin_enabled"],
                twin_synchronization_state=_TWIN_STATE_NAME[tw.state],
                twin_syncing_at=tw.syncing_at,
                twin_in_sync_at=tw.in_sync_at,
                twin_force_synchronization_at=tw.force_synchronization_at,
            )
        row["update_pendings"] = [
            {
                "correlation_id": p.meta.correlation_id,
                "twin_enabled": p.fields["twin_enabled"],
                "twin_force_synchronization": p.fields["twin_force_synchronization"],
                "valid_until": p.fields["valid_until"],
                "version": p.meta.version,
                "timestamp": p.meta.timestamp,
            }
            for p in a.pendings
            if _open(p.fields["valid_until"], t)
        ]
        row.update(a.tail())
        return row

    @staticmethod
    def _link_rows(a: _LinksAgg) -> list[dict[str, Any]]:
        tail = a.tail()
        rows = []
        for href, (link, v, ts) in a.links.items():
            rows.append(
                {
                    "owner_id": a.owner_id,
                    "device_id": a.device_id,
                    "href": href,
                    "aggregate_id": a.aggregate_id,
                    "resource_types": list(link.resource_types),
                    "interfaces": list(link.interfaces),
                    "anchor": link.anchor,
                    "title": link.title,
                    "supported_content_types": list(link.supported_content_types),
                    "valid_until": link.valid_until,
                    "policy_bit_flags": link.bit_flags,
                    "endpoint_informations": [{"endpoint": e, "priority": p} for e, p in link.endpoints],
                    "version": v,
                    "timestamp": ts,
                    "complete": tail["complete"],
                    "missing_versions": tail["missing_versions"],
                }
            )
        return rows


def expected_state(sim, through_interval: int) -> dict[str, list[dict[str, Any]]]:
    """Expected snapshot tables after all messages of intervals ``<= through_interval``.

    Snapshot time = end of that interval (pendings with ``valid_until != 0`` and
    ``valid_until < end`` are dropped). Rows follow ``tables.SNAPSHOT_TABLES`` /
    ``docs/data-contracts.md`` "Snapshot tables", sorted by ``tables.SNAPSHOT_SORT_KEYS``.

    :param sim: a ``Simulation`` from ``generate``.
    :returns: ``{"resources": [...], "device_metadata": [...], "device_links": [...],
        "owner_devices": [...]}`` (a fresh copy; callers may modify it).
    :raises ValueError: ``through_interval`` is not an interval index of ``sim``.
    """
    n = len(sim.states)
    if isinstance(through_interval, bool) or not isinstance(through_interval, int) or not 0 <= through_interval < n:
        raise ValueError(f"through_interval must be an interval index in 0..{n - 1}, got {through_interval!r}")
    return copy.deepcopy(sim.states[through_interval])
