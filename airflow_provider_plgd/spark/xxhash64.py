"""Spark SQL's ``xxhash64`` of a string, in pure Python: the snapshot bucket of a device.

A snapshot's bucket of a device is ``pmod(xxhash64(device_id), buckets)``
(``snapshot_store.BUCKET_EXPR``). ``rebuild_input`` needs it inside Python tasks without a Spark
SQL job (a first SQL query costs a fresh JVM several seconds) and without a compiled extension (the
``--py-files`` zip must run on executors where nothing is installed), hence this module.

Spark hashes a string column as the 64-bit xxHash (XXH64) of its UTF-8 bytes with seed 42
(``org.apache.spark.sql.catalyst.expressions.XxHash64``, ``XXH64.hashUnsafeBytes``: the reference
algorithm, words read little-endian) and returns it as a signed ``long``. Source: Yann Collet's
xxHash specification (``doc/xxhash_spec.md``, XXH64); checked against Spark itself by
``tests/integration/test_dedupe_rebuild.py``. Cost per device ID: docs/performance.md, M14.
"""

from __future__ import annotations

import struct

__all__ = ["SPARK_SEED", "bucket", "spark_xxhash64", "xxh64"]

#: The seed of Spark SQL's ``xxhash64`` function.
SPARK_SEED = 42
_M = (1 << 64) - 1
_P1 = 0x9E3779B185EBCA87
_P2 = 0xC2B2AE3D27D4EB4F
_P3 = 0x165667B19E3779F9
_P4 = 0x85EBCA77C2B2AE63
_P5 = 0x27D4EB2F165667C5


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _M, 31) * _P1) & _M


def _merge(acc: int, value: int) -> int:
    return ((acc ^ _round(0, value)) * _P1 + _P4) & _M


def xxh64(data: bytes, seed: int = 0) -> int:
    """XXH64 of ``data`` with ``seed``: an unsigned 64-bit int (the reference algorithm)."""
    n = len(data)
    i = 0
    seed &= _M
    if n >= 32:
        v1, v2, v3, v4 = (seed + _P1 + _P2) & _M, (seed + _P2) & _M, seed, (seed - _P1) & _M
        while i + 32 <= n:
            a, b, c, d = struct.unpack_from("<4Q", data, i)
            v1, v2, v3, v4 = _round(v1, a), _round(v2, b), _round(v3, c), _round(v4, d)
            i += 32
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _M
        for v in (v1, v2, v3, v4):
            h = _merge(h, v)
    else:
        h = (seed + _P5) & _M
    h = (h + n) & _M
    while i + 8 <= n:
        (lane,) = struct.unpack_from("<Q", data, i)
        h = (_rotl(h ^ _round(0, lane), 27) * _P1 + _P4) & _M
        i += 8
    if i + 4 <= n:
        (lane,) = struct.unpack_from("<I", data, i)
        h = (_rotl(h ^ ((lane * _P1) & _M), 23) * _P2 + _P3) & _M
        i += 4
    while i < n:
        h = (_rotl(h ^ ((data[i] * _P5) & _M), 11) * _P1) & _M
        i += 1
    h ^= h >> 33
    h = (h * _P2) & _M
    h ^= h >> 29
    h = (h * _P3) & _M
    return h ^ (h >> 32)


def spark_xxhash64(value: str) -> int:
    """Spark SQL ``xxhash64(value)`` for a string: a signed 64-bit int."""
    h = xxh64(value.encode("utf-8"), SPARK_SEED)
    return h - (1 << 64) if h >= (1 << 63) else h


def bucket(device_id: str, buckets: int) -> int:
    """``pmod(xxhash64(device_id), buckets)`` (``snapshot_store.BUCKET_EXPR``), in ``[0, buckets)``.

    :raises ValueError: ``buckets`` < 1.
    """
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    return spark_xxhash64(device_id) % buckets
