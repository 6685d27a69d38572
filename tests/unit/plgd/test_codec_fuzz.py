"""Hypothesis fuzzing of the plgd codec and the content decoder (no NATS, no Spark).

Properties (docs/reliability.md, "Bad input: fuzzing the codec and the decode application"):

* ``codec.decode_payload(subject, data)`` on random bytes, truncated valid payloads, bit-flipped
  valid payloads, payloads of another subject and random subjects either returns a ``Decoded``
  whose ``event_type`` is a known type, or raises ``PlgdDecodeError`` whose ``reason`` is one of
  ``DECODE_ERROR_REASONS`` and whose message is non-empty and short (it names the detail, never
  the whole payload). Nothing else ever escapes (no snappy, cramjam or protobuf exception).
* ``content.content_to_json`` never raises on bytes: None for empty data, else valid JSON text.

Valid payloads come from the simulator (every live event type, lead resource types, old-hub
snapshots). Runs are deterministic (``derandomize=True``, no example database), so CI is stable.
"""

from __future__ import annotations

import json
from functools import lru_cache

import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_plgd.plgd import codec
from airflow_provider_plgd.plgd.codec import DECODE_ERROR_REASONS, PlgdDecodeError
from airflow_provider_plgd.plgd.content import content_to_json, decode_content
from airflow_provider_plgd.plgd.event_types import EVENT_TYPES

FUZZ = settings(max_examples=150, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
#: An error message longer than this would quote the payload.
MAX_DETAIL = 600


@lru_cache(maxsize=1)
def samples() -> list[tuple[str, bytes]]:
    """``(subject, payload)`` of one valid message per (event type, subject form) of a small simulation."""
    from airflow_provider_plgd.simulator import SimulationConfig, generate

    sim = generate(SimulationConfig(seed=5, owners=1, devices_per_owner=2, resources_per_device=2, intervals=1,
                                    steps_per_interval=25, leadrt="first", old_hub_snapshots=True,
                                    unregister=True))
    seen: dict[tuple[str, bool], tuple[str, bytes]] = {}
    for m in sim.messages:
        if m.fault is None or m.fault == "old_hub_snapshot":
            seen.setdefault((m.event_type, ".leadrt" in m.subject), (m.subject, m.data))
    return sorted(seen.values())


def test_samples_cover_every_format():
    kinds = {codec.decode_payload(s, d).event_type for s, d in samples()}
    assert {"devicesregistered", "devicesunregistered", "resourcechanged", "resourcelinkspublished",
            "devicemetadataupdated"} <= kinds
    assert kinds <= set(EVENT_TYPES)


def check_decode(subject, data) -> str:
    """Decode; return ``"ok"`` or the error reason; fail the test on any other exception."""
    try:
        decoded = codec.decode_payload(subject, data)
    except PlgdDecodeError as err:
        assert err.reason in DECODE_ERROR_REASONS, err.reason
        detail = str(err)
        assert detail and len(detail) <= MAX_DETAIL, detail[:1000]
        return err.reason
    assert decoded.event_type in EVENT_TYPES
    return "ok"


sample_index = st.integers(min_value=0, max_value=10_000)


def pick(i: int) -> tuple[str, bytes]:
    s = samples()
    return s[i % len(s)]


@FUZZ
@given(i=sample_index, data=st.binary(max_size=300))
def test_random_bytes_on_a_valid_subject(i, data):
    subject, _ = pick(i)
    check_decode(subject, data)


@FUZZ
@given(i=sample_index, cut=st.integers(min_value=0, max_value=10_000))
def test_truncated_valid_payload(i, cut):
    subject, data = pick(i)
    check_decode(subject, data[: cut % max(1, len(data))])


@FUZZ
@given(i=sample_index, flips=st.lists(st.integers(min_value=0, max_value=1 << 20), min_size=1, max_size=8))
def test_bit_flips_in_a_valid_payload(i, flips):
    subject, data = pick(i)
    buf = bytearray(data)
    for f in flips:
        bit = f % (len(buf) * 8)
        buf[bit // 8] ^= 1 << (bit % 8)
    check_decode(subject, bytes(buf))


@FUZZ
@given(i=sample_index, j=sample_index)
def test_payload_of_another_subject(i, j):
    subject, _ = pick(i)
    _, data = pick(j)
    reason = check_decode(subject, data)
    if pick(i)[0] == pick(j)[0]:
        assert reason == "ok"


token = st.lists(st.sampled_from([
    *"abcdef0123456789-_.*> /\t\x00\u00e9\u2603",
    "plgd", "owners", "devices", "resources", "registrations", "metadata", "resource-links", "leadrt",
    "resourcechanged", "devicesregistered", "devicemetadataupdated", "resourcelinkspublished"]),
    max_size=6).map("".join)


@FUZZ
@given(i=sample_index, parts=st.lists(token, min_size=0, max_size=12), mutate=st.booleans())
def test_random_subjects(i, parts, mutate):
    subject, data = pick(i)
    if mutate and parts:  # a valid subject with some tokens replaced
        tokens = subject.split(".")
        for k, p in enumerate(parts):
            tokens[k % len(tokens)] = p
        candidate = ".".join(tokens)
    else:
        candidate = ".".join(parts)
    check_decode(candidate, data)


@FUZZ
@given(data=st.binary(max_size=300), et=st.sampled_from([*sorted(EVENT_TYPES), None, "nope"]))
def test_format_decoders_directly(data, et):
    for call in (lambda: codec.decode_resource_aggregate_payload(data),
                 lambda: codec.decode_identity_store_payload(data, et)):
        try:
            call()
        except PlgdDecodeError as err:
            assert err.reason in DECODE_ERROR_REASONS and str(err)
        except ValueError as err:  # an invalid event_type argument is a caller error, named clearly
            assert et not in EVENT_TYPES and repr(et) in str(err), err


def test_non_bytes_payloads_are_decode_errors():
    subject, _ = samples()[0]
    for value in (None, 5, "text", [1, 2]):
        assert check_decode(subject, value) != "ok"


# ---- content_to_json -----------------------------------------------------------------------
CONTENT_TYPES = ["", "application/vnd.ocf+cbor", "application/cbor", "application/json", "text/plain",
                 "application/senml+json", "application/foo+cbor", "text/html; charset=latin-1",
                 "application/octet-stream", "MediaType(12345)", "application/JSON ; x=y"]
COAP_FORMATS = [-1, 0, 40, 41, 42, 50, 60, 110, 112, 10000, 11542, 11543, 65535]
cbor_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats()
    | st.text(max_size=20) | st.binary(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.text(max_size=5) | st.integers(-5, 5) | st.binary(max_size=3), children, max_size=4),
    max_leaves=8,
)


def check_content(data, content_type, fmt):
    text = content_to_json(data, content_type, fmt)
    if not data:
        assert text is None
        return None
    assert isinstance(text, str)
    return json.loads(text)  # always valid JSON (NaN/Infinity never written)


@FUZZ
@given(data=st.binary(max_size=200), ct=st.sampled_from(CONTENT_TYPES) | token,
       fmt=st.sampled_from(COAP_FORMATS) | st.integers(min_value=-(2**31), max_value=2**31))
def test_content_random_bytes_never_raise(data, ct, fmt):
    check_content(data, ct, fmt)


@FUZZ
@given(value=cbor_values, cut=st.integers(min_value=0, max_value=400), tag=st.integers(0, 300))
def test_content_cbor_structures_truncated_and_tagged(value, cut, tag):
    encoded = cbor2.dumps(value)
    assert content_to_json(encoded, "application/vnd.ocf+cbor", 10000) is not None
    check_content(encoded, "application/vnd.ocf+cbor", 10000)
    check_content(encoded[:cut], "", 10000)  # truncated: CBOR or the base64 fallback
    check_content(cbor2.dumps(cbor2.CBORTag(tag, value)), "application/cbor", -1)


@FUZZ
@given(data=st.binary(min_size=1, max_size=120))
def test_content_fallback_is_base64_of_the_bytes(data):
    import base64

    text, encoding = decode_content(data, "application/json", 50)
    if encoding == "base64":
        assert json.loads(text) == base64.b64encode(data).decode()


@pytest.mark.parametrize("bad", [5, "text", [b"x"]])
def test_content_non_bytes_is_a_type_error(bad):
    with pytest.raises(TypeError, match="bytes-like"):
        content_to_json(bad, "application/json", 50)
