"""The values the simulated hub sends (:mod:`.hub`): resource contents (CBOR), update requests,
ETags, resource links, and the plan of a pending command (when its confirmation comes).

Each function draws only from the ``rng`` it is given, in a fixed order, so a simulation with the
same seed gives the same messages.
"""

from __future__ import annotations

import random
from typing import Any

import cbor2

from .model import CBOR_CONTENT_FORMAT, CBOR_CONTENT_TYPE, SECOND, Clock, DeviceSim, ResourceSim
from .records import Content, Link


def initial_value(rng: random.Random, dev: DeviceSim, res: ResourceSim) -> dict[str, Any]:
    """The first value of resource ``res`` of ``dev`` (by the resource's kind)."""
    kind = res.spec.kind
    if kind == "light":
        return {"name": res.spec.title, "power": rng.randrange(101), "state": rng.random() < 0.5}
    if kind == "switch":
        return {"value": rng.random() < 0.5}
    return {"n": f"sim-device-{dev.index}", "di": dev.device_id, "piid": dev.piid,
            "icv": "ocf.2.0.5", "dmv": "ocf.res.1.3.0,ocf.sh.1.3.0"}


def update_request(rng: random.Random, res: ResourceSim) -> dict[str, Any]:
    """A partial update that changes the current value of ``res``."""
    v = res.value
    kind = res.spec.kind
    if kind == "light":
        if rng.random() < 0.5:
            return {"state": not v["state"]}
        power = rng.randrange(100)
        return {"power": power if power != v["power"] else 100}
    if kind == "switch":
        return {"value": not v["value"]}
    while True:
        name = f"sim-device-{rng.randrange(1_000_000)}"
        if name != v["n"]:
            return {"n": name}


def cbor_content(value: dict[str, Any]) -> Content:
    """``value`` as CBOR content (plgd's content type and CoAP content format)."""
    return Content(cbor2.dumps(value), CBOR_CONTENT_TYPE, CBOR_CONTENT_FORMAT)


def random_etag(rng: random.Random) -> bytes:
    """A random 8-byte ETag."""
    return rng.getrandbits(64).to_bytes(8, "big")


def resource_link(dev: DeviceSim, res: ResourceSim) -> Link:
    """The resource link of ``res`` as ``dev`` publishes it (its title carries the title revision)."""
    title = res.spec.title if res.title_rev == 0 else f"{res.spec.title} (rev {res.title_rev})"
    return Link(res.href, dev.device_id, res.types, res.spec.interfaces, f"ocf://{dev.device_id}", title,
                (CBOR_CONTENT_TYPE,), 0, 3 if res.spec.kind != "device" else 1, ((dev.endpoint, 1),))


def pending_plan(rng: random.Random, clock: Clock, ts: int) -> tuple[str, int]:
    """(variant, valid_until) of a command pending at ``ts`` (ns): ``now`` confirmed at once,
    ``later`` confirmable later, ``never`` open forever, ``expired`` expires before the interval
    end, ``expiring`` expires half-way through the next interval."""
    r = rng.random()
    if r < 0.6:
        return "now", 0 if r < 0.2 else ts + 10 * SECOND
    if r < 0.75:
        return "later", 0 if r < 0.7 else ts + 3600 * SECOND
    if r < 0.8:
        return "never", 0
    if r < 0.9:
        return "expired", ts + max(1, min(SECOND // 10, (clock.end - ts) // 2))
    return "expiring", clock.end + clock.interval // 2
