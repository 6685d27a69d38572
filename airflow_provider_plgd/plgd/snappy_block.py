"""Snappy block decompression with a cap on the decoded size: the codec's guard against decode bombs.

A device controls its resource content, and snappy expands up to ~21x (a 1 MiB payload of zeros
holds a 22 MiB inner event). Before decompressing, :func:`decompress` reads the uncompressed length
that every snappy block starts with ("The stream starts with the uncompressed length (up to a
maximum of 2^32 - 1), stored as a little-endian varint", google/snappy ``format_description.txt``
§1; read with ``cramjam.snappy.decompress_raw_len``, the library under python-snappy) and refuses a
block that would decode to more than ``max_decoded_bytes`` (default
:data:`DEFAULT_MAX_DECODED_BYTES`, 4 MiB) with reason ``content_too_large``: nothing is
decompressed then. The inner event holds the resource content (``Content.data``), so the cap
bounds the content's decoded bytes too.
"""

from __future__ import annotations

from typing import Any

import snappy
from cramjam import snappy as _raw_snappy

from ..exceptions import PlgdDecodeError

#: Default cap (bytes) on the decoded (snappy-decompressed) size of one event, and so of its
#: resource content: 4 MiB. Four times NATS' default ``max_payload`` (1 MiB); plgd resource
#: contents (OCF resource representations) are far smaller. Over it: ``content_too_large``.
DEFAULT_MAX_DECODED_BYTES = 4 * 1024 * 1024


def short_error(exc: BaseException) -> str:
    """The text of ``exc`` for an error message: at most 200 characters."""
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "..."


def max_snappy_output(compressed_len: int) -> int:
    """Most bytes a snappy block of ``compressed_len`` bytes can decode to: the densest element is a
    3-byte copy of up to 64 bytes (google/snappy ``format_description.txt`` §2.2.2), so larger
    declared lengths mean a corrupt header (``bad_snappy``), not a bomb."""
    return (compressed_len // 3 + 1) * 64


def decompress(data: Any, what: str, max_decoded_bytes: int | None) -> bytes:
    """``data`` (snappy block format) decompressed, refused before decompressing when its header
    declares more than ``max_decoded_bytes`` (None: no cap).

    :param what: names ``data`` in the error message, e.g. ``"identity-store payload"``.
    :raises PlgdDecodeError: ``content_too_large`` over the cap; ``bad_snappy`` for anything that is
        not a snappy block (also a header that declares more than the block could encode).
    """
    try:
        if max_decoded_bytes is not None:
            # the varint header of the block (snappy format_description.txt §1); nothing decompressed yet
            declared = _raw_snappy.decompress_raw_len(data)
            if declared > max_decoded_bytes and declared > max_snappy_output(len(data)):
                raise PlgdDecodeError(
                    "bad_snappy",
                    f"{what} ({len(data)} bytes) is not snappy block format: its header declares "
                    f"{declared} bytes, more than {len(data)} bytes of snappy can encode",
                )
            if declared > max_decoded_bytes:
                raise PlgdDecodeError(
                    "content_too_large",
                    f"{what} ({len(data)} bytes) would decode to {declared} bytes, over the cap of "
                    f"{max_decoded_bytes} bytes (max_decoded_bytes, decode app --max-content-bytes)",
                )
        return snappy.decompress(data)
    except PlgdDecodeError:
        raise
    except Exception as exc:  # snappy.UncompressError, cramjam errors, TypeError for non-bytes
        size = len(data) if isinstance(data, (bytes, bytearray, memoryview)) else type(data).__name__
        raise PlgdDecodeError(
            "bad_snappy", f"{what} ({size} bytes) is not snappy block format: {short_error(exc)}"
        ) from exc
