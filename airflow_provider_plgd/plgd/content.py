"""Resource content (``resourceaggregate.pb.Content``) to JSON text (docs/wire-format.md §5).

``Content`` has ``data`` (bytes), ``content_type`` (media-type string or ``""``) and
``coap_content_format`` (CoAP number, ``-1`` = not provided). Decision order (§5): use
``content_type`` if non-empty; else ``coap_content_format`` if >= 0; else the data is treated
as binary (base64).

Encodings (§5 table; the suggested decodings there are marked (inferred) in docs/wire-format.md):

* ``cbor`` - ``application/cbor`` (60), ``application/vnd.ocf+cbor`` (10000, what OCF devices
  send), senml/senml-etch/lwm2m ``+cbor`` (112, 322, 11544): decoded with ``cbor2`` and
  written as canonical JSON. Conversions: byte strings -> standard base64 text (with padding);
  map keys that are not text -> text (integers as decimal digits, ``true``/``false``/``null``,
  byte strings as base64, anything else as its canonical JSON text; if two keys collide after
  conversion, or are equal in Python such as ``1``/``1.0``/``true`` already while cbor2 decodes,
  the later one wins); a tag -> its value (converted recursively; tags 0/1 date-time
  and 100/1004 date keep their raw string/number; cbor2's semantic decodings become natural JSON:
  bignums -> integers, decimal fractions/bigfloats/rationals -> numbers, UUIDs and IP
  addresses -> strings, sets -> arrays sorted by their JSON text, regexps -> pattern strings);
  ``undefined``, other simple values, NaN and +-Infinity -> ``null``. Bytes after the first
  CBOR data item are ignored (``cbor2.loads`` behaviour).
* ``json`` - ``application/json`` (50), json-patch/merge-patch (51, 52), senml (110),
  ``coap-group+json`` (256), senml-etch (320), lwm2m+json (11543): parsed with ``json`` and
  re-serialized canonically.
* ``text`` - ``text/plain; charset=utf-8`` (0), ``application/link-format`` (40),
  ``application/xml`` (41): UTF-8 text as a JSON string.
* ``base64`` - everything else (octet-stream, exi, cose*, cwt, lwm2m+tlv, unknown numbers or
  ``MediaType(n)`` strings, and ``-1``/``""``): a JSON string holding standard base64.

Canonical JSON = ``json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``.
For a content-type string not in the table the media type (before ``;``, lower-cased) is looked
up; then a ``+json``/``+cbor`` suffix selects JSON/CBOR and a ``text/`` prefix selects text.

**Fallback, never raises on bad content:** data that is malformed for its declared format
(invalid CBOR, invalid JSON or JSON with NaN/Infinity, text that is not UTF-8, CBOR nested too
deeply) becomes a JSON string of the base64 of the raw bytes, and ``decode_content`` reports
the encoding ``"base64"`` for it.
"""

from __future__ import annotations

import base64
import datetime as _dt
import email.message
import json
import math
import re
from collections.abc import Mapping
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
from typing import Any

import cbor2

__all__ = [
    "ENCODING_BASE64",
    "ENCODING_CBOR",
    "ENCODING_EMPTY",
    "ENCODING_JSON",
    "ENCODING_TEXT",
    "content_encoding",
    "content_to_json",
    "decode_content",
]

ENCODING_EMPTY = "empty"
ENCODING_CBOR = "cbor"
ENCODING_JSON = "json"
ENCODING_TEXT = "text"
ENCODING_BASE64 = "base64"

_C, _J, _T, _B = ENCODING_CBOR, ENCODING_JSON, ENCODING_TEXT, ENCODING_BASE64

# docs/wire-format.md §5: CoAP content-format number -> (exact content_type string, encoding).
_FORMATS: dict[int, tuple[str, str]] = {
    0: ("text/plain; charset=utf-8", _T),
    16: ('application/cose; cose-type="cose-encrypt0"', _B),
    17: ('application/cose; cose-type="cose-mac0"', _B),
    18: ('application/cose; cose-type="cose-sign1"', _B),
    40: ("application/link-format", _T),
    41: ("application/xml", _T),
    42: ("application/octet-stream", _B),
    47: ("application/exi", _B),
    50: ("application/json", _J),
    51: ("application/json-patch+json", _J),
    52: ("application/merge-patch+json", _J),
    60: ("application/cbor", _C),
    61: ("application/cwt", _B),
    96: ('application/cose; cose-type="cose-encrypt"', _B),
    97: ('application/cose; cose-type="cose-mac"', _B),
    98: ('application/cose; cose-type="cose-sign"', _B),
    101: ("application/cose-key", _B),
    102: ("application/cose-key-set", _B),
    110: ("application/senml+json", _J),
    112: ("application/senml+cbor", _C),
    256: ("coap-group+json", _J),
    320: ("application/senml-etch+json", _J),
    322: ("application/senml-etch+cbor", _C),
    10000: ("application/vnd.ocf+cbor", _C),
    11542: ("application/vnd.oma.lwm2m+tlv", _B),
    11543: ("application/vnd.oma.lwm2m+json", _J),
    11544: ("application/vnd.oma.lwm2m+cbor", _C),
}
_KIND_BY_FORMAT: dict[int, str] = {n: kind for n, (_, kind) in _FORMATS.items()}
_KIND_BY_TYPE: dict[str, str] = {ct: kind for ct, kind in _FORMATS.values()}
# Media type without parameters -> encoding (first entry wins; all cose variants are base64).
_KIND_BY_MEDIA_TYPE: dict[str, str] = {}
for _ct, _kind in _FORMATS.values():
    _KIND_BY_MEDIA_TYPE.setdefault(_ct.split(";", 1)[0].strip().lower(), _kind)
del _ct, _kind

# CBOR tags kept as their raw value instead of cbor2's date/datetime objects: a malformed date
# must not turn the whole content into the base64 fallback.
_RAW_TAG_DECODERS: Mapping[int, Any] = {tag: (lambda value, immutable: value) for tag in (0, 1, 100, 1004)}

_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
_ENCODER_ASCII = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
)
_dumps = _ENCODER.encode
_b64 = base64.b64encode


@lru_cache(maxsize=1024)
def _kind_of_type_string(content_type: str) -> str:
    media = content_type.split(";", 1)[0].strip().lower()
    kind = _KIND_BY_MEDIA_TYPE.get(media)
    if kind is not None:
        return kind
    if media.endswith("+json"):
        return _J
    if media.endswith("+cbor"):
        return _C
    if media.startswith("text/"):
        return _T
    return _B


def content_encoding(content_type: str | None, coap_content_format: int | None) -> str:
    """How content with these attributes is decoded: ``"cbor"``, ``"json"``, ``"text"`` or
    ``"base64"`` (docs/wire-format.md §5; decision order: ``content_type`` if non-empty, else
    ``coap_content_format`` if >= 0, else ``"base64"``). ``None`` counts as ``""`` / ``-1``.
    Never raises for str/int/None input.
    """
    if content_type:
        kind = _KIND_BY_TYPE.get(content_type)
        return kind if kind is not None else _kind_of_type_string(content_type)
    if coap_content_format is not None and coap_content_format >= 0:
        return _KIND_BY_FORMAT.get(coap_content_format, _B)
    return _B


def _base64_json(data: bytes) -> str:
    # base64 output is ASCII, so the JSON string is just the quoted text.
    return '"' + _b64(data).decode("ascii") + '"'


def _key_text(key: Any) -> str:
    if type(key) is str:
        return key
    value = _to_jsonable(key)
    if isinstance(value, str):
        return value
    return _dumps(value)


def _float_or_none(value: Any) -> float | None:
    try:
        f = float(value)
    except (OverflowError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _to_jsonable(obj: Any) -> Any:
    """Convert a cbor2-decoded value to JSON-serializable Python (rules in the module doc)."""
    t = type(obj)
    if t is str or t is int or t is bool or obj is None:
        return obj
    if t is float:
        return obj if math.isfinite(obj) else None
    if t is dict or isinstance(obj, (Mapping, cbor2.frozendict)):
        return {_key_text(k): _to_jsonable(v) for k, v in obj.items()}
    if t is list or t is tuple:
        return [_to_jsonable(x) for x in obj]
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return _b64(obj).decode("ascii")
    if isinstance(obj, cbor2.CBORTag):
        return _to_jsonable(obj.value)
    if obj is cbor2.undefined or isinstance(obj, cbor2.CBORSimpleValue):
        return None
    if isinstance(obj, (set, frozenset)):
        items = [_to_jsonable(x) for x in obj]
        return sorted(items, key=_dumps)
    if isinstance(obj, bool):
        return bool(obj)
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, (float, Decimal, Fraction)):
        return _float_or_none(obj)
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, (_dt.datetime, _dt.date, _dt.time)):
        return obj.isoformat()
    if isinstance(obj, re.Pattern):
        return obj.pattern
    if isinstance(obj, email.message.Message):
        return obj.as_string()
    if isinstance(obj, (list, tuple)):
        return [_to_jsonable(x) for x in obj]
    return str(obj)  # uuid.UUID, ipaddress objects, anything else cbor2 may produce


def _object_hook(obj: Any, immutable: bool) -> Any:
    # Make map keys text while decoding, so the fast path sorts the final keys (canonical form)
    # instead of failing or sorting integers numerically.
    if immutable:
        return obj
    for key in obj:
        if type(key) is not str:
            return {_key_text(k): v for k, v in obj.items()}
    return obj


def _cbor_to_json(data: bytes) -> str:
    value = cbor2.loads(data, semantic_decoders=_RAW_TAG_DECODERS, object_hook=_object_hook)
    try:
        return _dumps(value)  # fast path: only str/int/float/bool/None/list/dict inside
    except (TypeError, ValueError):
        return _dumps(_to_jsonable(value))


def _json_to_json(data: bytes) -> str:
    text = _dumps(json.loads(data))
    if b"\\u" in data or b"\\U" in data:
        # An escaped lone surrogate cannot be written as UTF-8; escape everything in that case.
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = _ENCODER_ASCII.encode(json.loads(data))
    return text


def decode_content(
    data: bytes | bytearray | memoryview | None,
    content_type: str | None,
    coap_content_format: int | None,
) -> tuple[str | None, str]:
    """Like ``content_to_json`` but also returns the encoding actually used.

    :returns: ``(json_text, encoding)``; ``(None, "empty")`` for empty or None data; otherwise
        encoding is ``"cbor"``, ``"json"``, ``"text"`` or ``"base64"`` (also for the fallback of
        malformed data).
    :raises TypeError: ``data`` is not bytes-like or None (a programming error, not bad content).
    """
    if not data and (data is None or isinstance(data, (bytes, bytearray, memoryview))):
        return None, ENCODING_EMPTY
    if type(data) is not bytes:
        if not isinstance(data, (bytearray, memoryview)):
            raise TypeError(f"content data must be bytes-like or None, got {type(data).__name__}")
        data = bytes(data)
    kind = content_encoding(content_type, coap_content_format)
    try:
        if kind == _C:
            return _cbor_to_json(data), _C
        if kind == _J:
            return _json_to_json(data), _J
        if kind == _T:
            return _dumps(data.decode("utf-8")), _T
    except Exception:  # malformed content of the declared format: documented base64 fallback
        pass
    return _base64_json(data), _B


def content_to_json(
    data: bytes | bytearray | memoryview | None,
    content_type: str | None,
    coap_content_format: int | None,
) -> str | None:
    """JSON text of a resource content (docs/wire-format.md §5; rules in the module docstring).

    :param data: ``Content.data`` (bytes).
    :param content_type: ``Content.content_type``, e.g. ``"application/vnd.ocf+cbor"`` or ``""``.
    :param coap_content_format: ``Content.coap_content_format``, e.g. 10000, or -1.
    :returns: canonical JSON text (a str), or None when ``data`` is empty or None. Examples:
        CBOR ``{"power": 5}`` -> ``'{"power":5}'``; text ``hi`` -> ``'"hi"'``; octet-stream
        ``b"\\x00"`` -> ``'"AA=="'``.
    :raises TypeError: only if ``data`` is not bytes-like or None; malformed content never
        raises, it falls back to a JSON string of base64.
    """
    return decode_content(data, content_type, coap_content_format)[0]
