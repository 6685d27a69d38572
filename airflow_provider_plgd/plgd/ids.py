"""Identifiers used by plgd hub in subjects and envelopes.

Every value here is a name-based UUID v5 in the URL namespace (Go ``uuid.NewSHA1(uuid.NameSpaceURL,
[]byte(s))``, identical to Python :func:`uuid.uuid5` with :data:`uuid.NAMESPACE_URL`), rendered as
lower-case canonical text (``xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``).

Source: ``docs/wire-format.md`` §1.2 (subject tokens), §2.2 (envelope ``aggregate_id``), §4.1
(aggregates) and §6 (computed reference values), plgd hub v2.25.0.

The functions are cached (``functools.lru_cache``): in a batch the same owners, hrefs and devices
repeat for every message, and a cache hit is several times cheaper than hashing again.
"""

from __future__ import annotations

import uuid
from functools import lru_cache

__all__ = [
    "LINKS_HREF",
    "METADATA_HREF",
    "NIL_UUID",
    "href_id",
    "is_go_uuid",
    "links_aggregate_id",
    "metadata_aggregate_id",
    "owner_id",
    "resource_aggregate_id",
    "uuid5_url",
]

#: Pseudo-href of the per-device resource-links aggregate (docs/wire-format.md §4.1).
LINKS_HREF = "/plgd/res"
#: Pseudo-href of the per-device device-metadata aggregate (docs/wire-format.md §4.1).
METADATA_HREF = "/plgd/s"
#: Go ``uuid.Nil`` rendered as text.
NIL_UUID = "00000000-0000-0000-0000-000000000000"

_CACHE_SIZE = 1 << 16
_NAMESPACE_URL = uuid.NAMESPACE_URL
_HEX = frozenset(b"0123456789abcdefABCDEF")
# Byte offsets of the 16 hex pairs in the 36-byte canonical form (google/uuid Parse).
_HEX_PAIRS = (0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34)


def _require_str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}: {value!r}")
    return value


def uuid5_url(name: str) -> str:
    """Return ``str(uuid.uuid5(uuid.NAMESPACE_URL, name))``: lower-case canonical UUID text.

    ``name`` is hashed as its UTF-8 bytes, like Go's ``[]byte(name)`` (docs/wire-format.md §1.2).
    Raises TypeError if ``name`` is not a str.
    """
    return str(uuid.uuid5(_NAMESPACE_URL, _require_str(name, "name")))


@lru_cache(maxsize=_CACHE_SIZE)
def href_id(href: str) -> str:
    """Subject token ``hrefId`` of a resource: ``uuid5(NAMESPACE_URL, href)``.

    Only the href is hashed, not device ID + href (hub >= v2.8.0; docs/wire-format.md §1.2).
    Example: ``href_id("/light/1") == "78baefb2-dcdc-50c3-bb55-5ff4c5e4c8b2"``.
    Raises TypeError if ``href`` is not a str.
    """
    return uuid5_url(_require_str(href, "href"))


def _go_uuid_bytes_ok(b: bytes) -> bool:
    """True if the 36 bytes ``b`` have the ``xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` shape."""
    if b[8] != 0x2D or b[13] != 0x2D or b[18] != 0x2D or b[23] != 0x2D:  # '-'
        return False
    hexes = _HEX
    for x in _HEX_PAIRS:  # noqa: SIM110 - a plain loop: twice as fast as all() over a generator
        if b[x] not in hexes or b[x + 1] not in hexes:
            return False
    return True


def _go_uuid_parse(s: str) -> str | None:
    """Mimic Go ``github.com/google/uuid`` v1.6.0 ``Parse``; return the 32 hex digits or None.

    Accepted spellings (lengths are in UTF-8 bytes, as Go's ``len(s)``):
    36 ``xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` (either case); 45 ``urn:uuid:`` + 36 (prefix
    case-insensitive); 38 = one byte + 36 + one byte (Go only examines the middle 36 bytes, so
    ``{...}`` but also any other single-byte wrapper is accepted); 32 plain hex digits.
    """
    try:
        b = s.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: cannot come from a Go string
        return None
    n = len(b)
    if n == 36:
        pass
    elif n == 45:
        if b[:9].lower() != b"urn:uuid:":
            return None
        b = b[9:]
    elif n == 38:
        b = b[1:37]
    elif n == 32:
        hexes = _HEX
        if all(c in hexes for c in b):
            return b.decode("ascii").lower()
        return None
    else:
        return None
    if not _go_uuid_bytes_ok(b):
        return None
    return b.decode("ascii").replace("-", "").lower()


def is_go_uuid(value: str) -> bool:
    """True if Go ``uuid.Parse(value)`` succeeds (any spelling listed in ``owner_id``)."""
    return _go_uuid_parse(_require_str(value, "value")) is not None


@lru_cache(maxsize=_CACHE_SIZE)
def owner_id(owner: str) -> str:
    """Subject token ``ownerId`` for a raw owner claim value (``identity-store/events.OwnerToUUID``).

    Rule (docs/wire-format.md §1.2): if ``owner`` parses as a UUID with Go ``uuid.Parse`` and is not the
    nil UUID, the **original string is returned unchanged** (so an upper-case, ``urn:uuid:``,
    ``{braced}`` or 32-hex spelling stays as written); otherwise ``uuid5(NAMESPACE_URL, owner)``.
    Go ``uuid.Parse`` accepts: canonical 36 characters in either case, ``urn:uuid:`` + canonical
    (prefix in any case), 38 bytes where only the middle 36 are examined (``{...}``), and 32 hex
    digits. ``"*"`` is hashed like any other non-UUID owner; subscriptions use the literal ``*``
    without calling this function (see ``subjects.subject_filters``).

    Example: ``owner_id("a") == "e1407479-3136-56c0-9908-bb02fb0339e2"``.
    Raises TypeError if ``owner`` is not a str.
    """
    parsed = _go_uuid_parse(_require_str(owner, "owner"))
    if parsed is not None and parsed != "0" * 32:
        return owner
    return uuid5_url(owner)


@lru_cache(maxsize=_CACHE_SIZE)
def resource_aggregate_id(device_id: str, href: str) -> str:
    """``aggregate_id`` of a resource-state aggregate: ``uuid5(NAMESPACE_URL, device_id + href)``.

    An empty href gives the nil UUID, as plgd's ``ResourceId.ToUUID`` does (docs/wire-format.md §4.1).
    Example: device ``00000000-0000-0000-0000-000000000001`` + ``/light/1`` ->
    ``7d1aabc8-742c-5bd7-8d42-2fbf77af9440``.
    Raises TypeError if an argument is not a str.
    """
    _require_str(device_id, "device_id")
    if not _require_str(href, "href"):
        return NIL_UUID
    return uuid5_url(device_id + href)


def links_aggregate_id(device_id: str) -> str:
    """``aggregate_id`` of a device's resource-links aggregate: ``uuid5(URL, device_id + "/plgd/res")``.

    docs/wire-format.md §2.2/§4.1. Example: device ``00000000-0000-0000-0000-000000000001`` ->
    ``7bfecfc4-cbbb-59c2-8d8e-b004c12c30d6``. Raises TypeError if ``device_id`` is not a str.
    """
    return resource_aggregate_id(device_id, LINKS_HREF)


def metadata_aggregate_id(device_id: str) -> str:
    """``aggregate_id`` of a device's metadata aggregate: ``uuid5(URL, device_id + "/plgd/s")``.

    docs/wire-format.md §2.2/§4.1. Example: device ``00000000-0000-0000-0000-000000000001`` ->
    ``2c4c4360-71fc-5b9a-a544-4dbcf3bb8d45``. Raises TypeError if ``device_id`` is not a str.
    """
    return resource_aggregate_id(device_id, METADATA_HREF)
