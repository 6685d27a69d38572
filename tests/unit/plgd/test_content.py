"""Content decoding per format (docs/wire-format.md §5)."""

from __future__ import annotations

import base64
import json
import math

import cbor2
import pytest

from airflow_provider_plgd.plgd.content import content_encoding, content_to_json, decode_content

OCF_CBOR = ("application/vnd.ocf+cbor", 10000)
LIGHT = {"name": "Light", "power": 42, "state": True}


def b64json(data: bytes) -> str:
    return json.dumps(base64.b64encode(data).decode())


@pytest.mark.parametrize(
    ("content_type", "fmt"),
    [("application/vnd.ocf+cbor", 10000), ("application/cbor", 60), ("", 10000), ("", 60), ("application/vnd.ocf+cbor", -1)],
)
def test_cbor_light(content_type, fmt):
    data = cbor2.dumps({"state": True, "power": 42, "name": "Light"})
    assert content_to_json(data, content_type, fmt) == '{"name":"Light","power":42,"state":true}'


def test_cbor_conversions():
    value = {
        "bytes": b"\x00\x01\xff",
        1: "int key",
        b"\x01": "bytes key",
        "nested": [{"z": 1.5, "a": None}, [b"", -3]],
        "nan": float("nan"),
        "inf": float("-inf"),
        "undef": cbor2.undefined,
        "simple": cbor2.CBORSimpleValue(99),
        "tag": cbor2.CBORTag(4242, {"x": b"\x02"}),
        "big": 2**100,
        "text": "ünï",
    }
    out = content_to_json(cbor2.dumps(value), *OCF_CBOR)
    assert json.loads(out) == {
        "bytes": "AAH/",
        "1": "int key",
        "AQ==": "bytes key",
        "nested": [{"a": None, "z": 1.5}, ["", -3]],
        "nan": None,
        "inf": None,
        "undef": None,
        "simple": None,
        "tag": {"x": "Ag=="},
        "big": 2**100,
        "text": "ünï",
    }
    # canonical: sorted keys, compact separators, non-ASCII kept
    assert out == json.dumps(json.loads(out), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert "ünï" in out


def test_cbor_non_string_keys_sorted_as_text():
    out = content_to_json(cbor2.dumps({10: "a", 2: "b", 1: "c", None: "n", -1.5: "f"}), "application/cbor", 60)
    assert out == '{"-1.5":"f","1":"c","10":"a","2":"b","null":"n"}'
    assert content_to_json(cbor2.dumps({True: "t", "s": 1}), "application/cbor", 60) == '{"s":1,"true":"t"}'
    # array as key -> its canonical JSON text
    out = content_to_json(bytes.fromhex("a1820102f5"), "application/cbor", 60)  # {[1, 2]: true}
    assert out == '{"[1,2]":true}'


def test_cbor_semantic_tags():
    assert content_to_json(bytes.fromhex("c11a65000000"), *OCF_CBOR) == "1694498816"  # tag 1 -> raw epoch
    assert content_to_json(cbor2.dumps(cbor2.CBORTag(0, "2023-09-12T06:06:56Z")), *OCF_CBOR) == '"2023-09-12T06:06:56Z"'
    assert content_to_json(cbor2.dumps(cbor2.CBORTag(0, "not a date")), *OCF_CBOR) == '"not a date"'
    assert content_to_json(bytes.fromhex("c249010000000000000000"), *OCF_CBOR) == str(2**64)  # bignum
    assert content_to_json(cbor2.dumps({"s": {3, 1, 2}}), *OCF_CBOR) == '{"s":[1,2,3]}'
    import uuid

    u = uuid.UUID("3f2a1b4c-5d6e-4f70-8a9b-0c1d2e3f4a5b")
    assert content_to_json(cbor2.dumps(u), *OCF_CBOR) == '"3f2a1b4c-5d6e-4f70-8a9b-0c1d2e3f4a5b"'
    from decimal import Decimal

    assert content_to_json(cbor2.dumps(Decimal("1.25")), *OCF_CBOR) == "1.25"


def test_cbor_top_level_scalars():
    assert content_to_json(cbor2.dumps("hi"), *OCF_CBOR) == '"hi"'
    assert content_to_json(cbor2.dumps(7), *OCF_CBOR) == "7"
    assert content_to_json(cbor2.dumps(None), *OCF_CBOR) == "null"
    assert content_to_json(cbor2.dumps(b"\x00"), *OCF_CBOR) == '"AA=="'


@pytest.mark.parametrize("bad", [b"\xa1", b"\x62\xff\xfe", b"\x9f\x01", b"\x1c", b"\xff"])
def test_cbor_malformed_falls_back_to_base64(bad):
    assert content_to_json(bad, *OCF_CBOR) == b64json(bad)
    assert decode_content(bad, *OCF_CBOR) == (b64json(bad), "base64")


def test_cbor_too_deep_falls_back():
    deep = b"\x81" * 5000 + b"\x00"
    assert content_to_json(deep, *OCF_CBOR) == b64json(deep)


@pytest.mark.parametrize(
    ("content_type", "fmt"),
    [
        ("application/json", 50),
        ("", 50),
        ("application/merge-patch+json", 52),
        ("application/json-patch+json", -1),
        ("application/senml+json", 110),
        ("coap-group+json", 256),
        ("application/json; charset=utf-8", -1),
        ("application/vnd.custom+json", -1),
        ("", 11543),
    ],
)
def test_json_canonical(content_type, fmt):
    data = b'{ "power" : 42,\n "name": "L\\u00edght \xe2\x9c\x93", "a": [1, 2.50, {"y": null, "x": false}] }'
    assert content_to_json(data, content_type, fmt) == '{"a":[1,2.5,{"x":false,"y":null}],"name":"Líght ✓","power":42}'
    assert decode_content(data, content_type, fmt)[1] == "json"


@pytest.mark.parametrize("bad", [b"{", b'{"a":NaN}', b"\xff\xfe{}", b"[1,]", b"Infinity"])
def test_json_malformed_falls_back_to_base64(bad):
    assert content_to_json(bad, "application/json", 50) == b64json(bad)


def test_json_lone_surrogate_is_escaped():
    out = content_to_json(b'{"a":"\\ud800"}', "application/json", 50)
    assert out == '{"a":"\\ud800"}'
    out.encode("utf-8")
    assert json.loads(out)["a"] == "\ud800"


@pytest.mark.parametrize(
    ("content_type", "fmt"),
    [("text/plain; charset=utf-8", 0), ("", 0), ("application/link-format", 40), ("application/xml", 41), ("text/csv", -1)],
)
def test_text(content_type, fmt):
    data = 'line "1"\nżółw </a>'.encode()
    assert content_to_json(data, content_type, fmt) == '"line \\"1\\"\\nżółw </a>"'
    assert decode_content(data, content_type, fmt)[1] == "text"


def test_text_not_utf8_falls_back():
    assert content_to_json(b"\xff\xfe", "text/plain; charset=utf-8", 0) == b64json(b"\xff\xfe")


@pytest.mark.parametrize(
    ("content_type", "fmt"),
    [
        ("application/octet-stream", 42),
        ("", 42),
        ("application/exi", 47),
        ("application/cwt", 61),
        ('application/cose; cose-type="cose-sign1"', 18),
        ("", 96),
        ("application/cose-key", 101),
        ("application/vnd.oma.lwm2m+tlv", 11542),
        ("MediaType(12345)", 12345),
        ("", 12345),
        ("", -1),
        ("", -7),
    ],
)
def test_base64(content_type, fmt):
    data = b"\x00\x01\x02{not json}\xff"
    assert content_to_json(data, content_type, fmt) == '"AAECe25vdCBqc29uff8="'
    assert decode_content(data, content_type, fmt) == ('"AAECe25vdCBqc29uff8="', "base64")


def test_content_type_wins_over_number():
    data = cbor2.dumps(LIGHT)
    assert content_to_json(data, "application/vnd.ocf+cbor", 50) == '{"name":"Light","power":42,"state":true}'
    assert content_to_json(b'"x"', "application/json", 60) == '"x"'
    assert content_to_json(b"hi", "text/plain; charset=utf-8", 10000) == '"hi"'


def test_empty_data_is_none():
    for ct, fmt in [OCF_CBOR, ("", -1), ("application/json", 50), ("text/plain; charset=utf-8", 0)]:
        assert content_to_json(b"", ct, fmt) is None
        assert content_to_json(None, ct, fmt) is None
    assert decode_content(bytearray(), "", -1) == (None, "empty")


def test_bytes_like_input_and_type_error():
    data = cbor2.dumps(LIGHT)
    expected = '{"name":"Light","power":42,"state":true}'
    assert content_to_json(bytearray(data), *OCF_CBOR) == expected
    assert content_to_json(memoryview(data), *OCF_CBOR) == expected
    assert content_to_json(memoryview(b'{"b":1,"a":2}'), "application/json", 50) == '{"a":2,"b":1}'
    with pytest.raises(TypeError, match="str"):
        content_to_json("{}", "application/json", 50)


def test_content_encoding():
    assert content_encoding("application/vnd.ocf+cbor", 10000) == "cbor"
    assert content_encoding("", 60) == "cbor"
    assert content_encoding("application/senml-etch+cbor", -1) == "cbor"
    assert content_encoding("Application/JSON", -1) == "json"
    assert content_encoding("", 0) == "text"
    assert content_encoding("", -1) == "base64"
    assert content_encoding(None, None) == "base64"
    assert content_encoding("image/png", 50) == "base64"


def test_cbor_float_values_exact():
    out = content_to_json(cbor2.dumps({"t": 21.5, "h": 1e-7}), *OCF_CBOR)
    parsed = json.loads(out)
    assert parsed == {"h": 1e-7, "t": 21.5}
    assert not any(isinstance(v, float) and math.isnan(v) for v in parsed.values())
