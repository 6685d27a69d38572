"""The one rule for the storage root of staging and tables, and its one spelling for S3.

Order: an explicit value (operator ``storage_root`` or DAG param ``storage_root``), else the
``storage_root`` extra of the ``plgd_jetstream`` connection (plain or ``extra__plgd_jetstream__``
prefixed; the Airflow side reads it, ``hooks.base.connection_storage_root``, and passes the value
down: no module of ``tables/`` imports Airflow), else
``$AIRFLOW_HOME/plgd`` (``~/airflow/plgd`` when ``AIRFLOW_HOME`` is unset).

S3 and S3-compatible stores (MinIO, Ceph RGW) are spelled ``s3://bucket/prefix``. Every part of
the ETL (the fetch, the ledger, the summary and the Spark applications) reaches the root through
fsspec (``s3fs``, the ``s3`` extra), never through Hadoop. ``s3a://`` is Hadoop's name for the same
store; it is accepted as an alias and rewritten to ``s3://`` with a log line, so that one root has
one spelling in the ledger, the manifests and the logs (docs/operations.md, "Object storage").

Credentials and the endpoint are never part of the root: botocore reads them itself
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, config
files, instance roles). A root with credentials in it (``s3://KEY:SECRET@bucket``) is refused.

A root is compared (with the DAG author's allowlist, and with the root recorded with the tables)
only in the spelling of :func:`normalize_storage_root`, and that spelling is what fsspec and
delta-rs are given: anything that the two layers would resolve differently (percent escapes, dot
segments) is refused before any I/O.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)

# scheme://user[:password]@… (credentials in the authority part of a URL)
_URL_WITH_USERINFO = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/@]*@")


#: Characters that the two storage layers read differently, or that no root needs: a percent escape
#: (delta-rs decodes ``%2e%2e`` in a URL path, fsspec keeps it as three characters of a key), a
#: query or fragment (a URL parser drops them, fsspec keeps them), a backslash, white space and
#: control characters.
_AMBIGUOUS = re.compile(r"[%?#\\\s\x00-\x1f\x7f]")
#: Schemes whose authority is a bucket (or container): its name is case-insensitive to a URL parser
#: (delta-rs lowercases the host) and lowercase in every store that has them.
_BUCKET_SCHEMES = ("s3", "gs", "gcs")


def normalize_storage_root(value: str) -> str:
    """Return the one spelling of a storage root, the same for fsspec and delta-rs, or refuse it.

    The root is compared with allowlists and recorded with the tables in this spelling, and every
    storage layer gets this exact string, so a check of the string is a check of where the data goes:

    * the scheme in lowercase, ``s3a://`` rewritten to ``s3://``, ``file://`` to the plain path;
      the bucket of ``s3://``/``gs://`` in lowercase;
    * no trailing slash; repeated slashes folded into one; a local path must be absolute;
    * refused: a ``.`` or ``..`` segment (a URL parser removes dot segments, an object store key
      keeps them: ``s3://lake/sandbox/../prod`` is ``s3://lake/prod`` to delta-rs), a percent
      escape (``%2e%2e``: delta-rs decodes it, fsspec does not), ``?``, ``#``, ``\\``, white space,
      control characters, credentials in the authority, an empty value or bucket.

    :param value: a local path or an fsspec URL (``s3://bucket/prefix``, ``gs://…``, ``file://…``).
    :return: the root as the ETL uses it (ledger, tables, Spark arguments, logs).
    :raises ValueError: one of the refusals above; the message names the value (never a credential:
        with one, it names only the scheme) and what is expected.
    """
    text = str(value).strip()
    if _URL_WITH_USERINFO.match(text):
        scheme = text.split("://", 1)[0]
        raise ValueError(
            f"the storage root ({scheme}://…) has credentials in the URL; give the bucket URL only "
            "(s3://bucket/prefix) and the credentials through the AWS_* environment or AWS config "
            "files (docs/operations.md, 'Object storage')"
        )
    if not text:
        raise ValueError("the storage root is empty; expected a local path or a URL such as s3://bucket/prefix")
    found = _AMBIGUOUS.search(text)
    if found:
        raise ValueError(f"the storage root {text!r} has {found.group()!r}, which fsspec and delta-rs resolve "
                         "differently (percent escapes, '?', '#', '\\\\', white space); give the plain path")
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    scheme = scheme.lower()
    if scheme == "s3a":
        log.info("storage root %s: s3a:// is Hadoop's spelling; plgd reads S3 through fsspec (s3fs) and uses "
                 "s3://", text)
        scheme = "s3"
    if scheme == "file":
        scheme = ""
    absolute = rest.startswith("/")
    segments = [s for s in rest.split("/") if s]
    if any(s in (".", "..") for s in segments):
        raise ValueError(f"the storage root {text!r} has a '.' or '..' segment, which a URL parser removes and an "
                         "object store keeps; give the root itself")
    if scheme:
        if not segments:
            raise ValueError(f"the storage root {text!r} names no bucket or folder; expected e.g. s3://bucket/prefix")
        if scheme in _BUCKET_SCHEMES:
            segments[0] = segments[0].lower()
        return f"{scheme}://" + "/".join(segments)
    if not absolute:
        raise ValueError(f"the storage root {text!r} is a relative path, which each process resolves from its own "
                         "working directory; expected an absolute path or a URL such as s3://bucket/prefix")
    if not segments:
        raise ValueError(f"the storage root {text!r} is the file system's root; give a folder")
    return "/" + "/".join(segments)


def same_or_below(root: str, base: str) -> bool:
    """True when ``root`` is ``base`` or a folder below it (both in :func:`normalize_storage_root`'s spelling)."""
    return root == base or root.startswith(base + "/")


def resolve_storage_root(value: str | None, connection_root: str | None) -> str:
    """Return the storage root: a local path or an fsspec URL (``s3://…``), without a trailing slash
    (:func:`normalize_storage_root`).

    :param value: an explicit root; used when non-empty.
    :param connection_root: the next default: the ``storage_root`` extra of the ``plgd_jetstream``
        connection, looked up by the caller (the Airflow side:
        ``hooks.base.connection_storage_root``), or None. This module reads no connection.
    :raises ValueError: a root with credentials in the URL (:func:`normalize_storage_root`).
    """
    if value:
        return normalize_storage_root(value)
    if connection_root:
        return normalize_storage_root(connection_root)
    home = os.environ.get("AIRFLOW_HOME") or str(Path.home() / "airflow")
    return normalize_storage_root(str(Path(home).absolute() / "plgd"))
