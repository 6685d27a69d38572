"""Corrupt payloads: bytes on a valid plgd subject that the codec must reject (the simulator's
fault injector: ``plgd-simulate --faults corrupt``, ``SimulationConfig(corrupt=N)``; the generator
loads this module only when corrupt payloads are asked for).

Kinds: ``random_bytes``; ``truncated_protobuf`` (a real payload cut short); ``bad_snappy`` (a real
resource-aggregate envelope whose ``data`` is not snappy block format, or an identity-store
payload whose snappy length header is broken). Each payload is checked with
``codec.decode_payload``: it is kept only if that raises ``PlgdDecodeError``.
"""

from __future__ import annotations

import random

from airflow_provider_plgd.plgd import codec
from airflow_provider_plgd.plgd.pb import eventbus_pb2

__all__ = ["CORRUPT_KINDS", "corrupt_payload"]

CORRUPT_KINDS = ("random_bytes", "truncated_protobuf", "bad_snappy")
_BROKEN_SNAPPY_HEADER = b"\xff\xff\xff\xff\x0f"  # uvarint length 2^32-1: never decodable


def _candidate(kind: str, valid: bytes, identity_store: bool, rng: random.Random) -> bytes:
    if kind == "random_bytes":
        return rng.randbytes(rng.randrange(8, 96))
    if kind == "truncated_protobuf":
        return valid[: rng.randrange(len(valid) // 3, len(valid) - 1)]
    if kind == "bad_snappy":
        if identity_store:
            return _BROKEN_SNAPPY_HEADER + valid[1:]
        envelope = eventbus_pb2.Event.FromString(valid)
        envelope.data = _BROKEN_SNAPPY_HEADER + rng.randbytes(rng.randrange(4, 32))
        return envelope.SerializeToString(deterministic=True)
    raise ValueError(f"unknown corrupt payload kind {kind!r}; expected one of {CORRUPT_KINDS}")


def corrupt_payload(kind: str, subject: str, valid: bytes, rng: random.Random) -> bytes:
    """A payload of ``kind`` for ``subject``, derived from the valid payload ``valid`` of that
    subject, that ``codec.decode_payload(subject, payload)`` rejects with ``PlgdDecodeError``.

    :raises ValueError: unknown ``kind``.
    :raises RuntimeError: no rejected candidate within 100 tries (does not happen in practice).
    """
    identity_store = ".registrations." in subject
    for _ in range(100):
        data = _candidate(kind, valid, identity_store, rng)
        try:
            codec.decode_payload(subject, data)
        except codec.PlgdDecodeError:
            return data
    raise RuntimeError(f"could not make a {kind} payload that the codec rejects for {subject!r}")
