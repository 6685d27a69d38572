"""Pure fold logic of the snapshot rebuild: previous state of a device + its new events -> new state.

No Spark here: plain Python over ``events`` rows (dicts with the column names of
:data:`airflow_provider_plgd.spark.schemas.EVENTS_SCHEMA`, as ``pyarrow.Table.to_pylist()`` gives them). The rebuild
app calls :func:`fold_bucket_arrow` (Arrow in, Arrow out) once per touched bucket inside its
reduce tasks (``RDD.mapPartitions``, ``spark/rebuild_input.py``), which calls :func:`fold_device`
per device; the unit tests call both directly.
Semantics: ``docs/wire-format.md`` §4 (state of each aggregate kind) and §4.9 (the
consumer rules); the model followed is the resource-aggregate (RA) write side.

Unit of work: one **device**
-----------------------------
All state of one device lives together: its resource aggregates (one per href), its links
aggregate, its metadata aggregate and its registration (owner -> device). A
``devicesunregistered`` drops *all* of it at once (§4.7), so the device is the smallest unit that
can be folded independently. The device state is a dict of JSON types only (see
:func:`new_device_state`; :func:`dumps_state` / :func:`loads_state` round-trip it): content bytes
are kept as a digest, etags as base64 text.

Rules applied (each cites its source)
-------------------------------------
* Per aggregate ``(group_id, aggregate_id)``: events in ``version`` order, ``stream_seq`` breaking
  ties (§4.9 rule 1). A version ``<=`` the stored version is ignored (§4.3: duplicate/old).
* The first known version above 0, or a jump past ``stored + 1``, is a gap: the aggregate is kept,
  flagged ``complete = False``, and the missing version range is recorded (§4.9 rule 7). It is
  never guessed and never dropped; later versions keep folding on top.
* Old-hub ``*snapshottaken`` events (hub < v2.16.0) replace the whole state when their version is
  above the stored one (or nothing is stored); the aggregate is complete again (§4.9 rule 8, §4.3).
* Incarnations (§4.9 rule 3): a ``devicesunregistered`` drops all state of its devices; events of
  the device with ``timestamp <=`` the unregistration time are from the dropped incarnation and
  are ignored, also when they arrive in a later batch. A version-0 event whose timestamp is newer
  than the aggregate's last applied event starts a new incarnation of that aggregate (device
  deleted and re-created, versions restarting at 0), even without an unregistration.
* Resources (§4.4): ``latest`` = the last accepted ``resourcechanged``; a ``resourcechanged`` is
  dropped by the RA stale-skip rule (``ValidateSequence`` + ``Equal``). Pending commands per kind
  (create/retrieve/update/delete) are appended unless already expired at the event's timestamp;
  a confirmation removes the first pending of its kind with the same ``correlation_id``; a
  ``resourcedeleted`` with status ``OK``/``ACCEPTED`` clears all four lists, otherwise it removes
  its delete pending. ``resource_types`` follow the last event that carried a non-empty list.
* Links (§4.5): ``resourcelinkspublished`` upserts by href, ``resourcelinksunpublished`` removes
  the listed hrefs (an empty list removes all), the snapshot replaces the map.
* Device metadata (§4.6): the last ``devicemetadataupdated`` gives connection, ``twin_enabled``
  and ``twin_synchronization`` (a ``canceled`` one repeats the previous values); it resolves the
  pending with its (non-empty) ``correlation_id``; ``devicemetadataupdatepending`` is appended
  unless already expired. Before any update ``twin_enabled`` is true (the RA model's default).
* Registrations (§4.7): ``devicesregistered`` registers the device to the subject's
  ``owner_id`` (the latest registration wins; ``registered_at`` is its timestamp).
* Snapshot time (§4.9 rules 4 and 6): pendings with ``valid_until != 0`` and ``valid_until <
  snapshot_time_ns`` are dropped (:func:`expire_pendings`). Because snapshot times only grow, a
  pending dropped once would be dropped by every later snapshot too, so it is removed from the
  state for good.

Times are unix **nanoseconds** (``int``), as in the ``events`` table.

Modules, by concept
-------------------
* :mod:`~airflow_provider_plgd.spark.fold.state`: the device state (shape, JSON form, stored
  values, :class:`FoldStats`, expiry of pendings at the snapshot time).
* :mod:`~airflow_provider_plgd.spark.fold.rules`: the rules per aggregate kind (resources,
  links, device metadata).
* :mod:`~airflow_provider_plgd.spark.fold.device`: the fold of one device (event order, gaps,
  incarnations, registrations): :func:`fold_device`.
* :mod:`~airflow_provider_plgd.spark.fold.columns`: the input columns each event type needs.
* :mod:`~airflow_provider_plgd.spark.fold.rows`: the snapshot-table rows of a state.
* :mod:`~airflow_provider_plgd.spark.fold.arrow`: one bucket, Arrow in and out
  (:func:`fold_bucket_arrow`).

This package re-exports their public names (``from airflow_provider_plgd.spark import fold``).
"""

from __future__ import annotations

from airflow_provider_plgd.plgd.event_types import EVENT_TYPES
from airflow_provider_plgd.spark.fold.arrow import STATE_TABLE_NAME, fold_bucket_arrow, fold_output_schema
from airflow_provider_plgd.spark.fold.columns import BASE_COLUMNS, COLUMNS_BY_EVENT_TYPE, FOLD_INPUT_COLUMNS
from airflow_provider_plgd.spark.fold.device import fold_device
from airflow_provider_plgd.spark.fold.rows import SNAPSHOT_TABLE_NAMES, device_rows
from airflow_provider_plgd.spark.fold.state import (
    DEVICES_REGISTERED,
    DEVICES_UNREGISTERED,
    PENDING_KINDS,
    STATE_FORMAT_VERSION,
    FoldStats,
    _digest,
    content_digest,
    dumps_state,
    expire_pendings,
    is_empty_state,
    loads_state,
    new_device_state,
    next_expiry,
)

__all__ = [
    "BASE_COLUMNS",
    "COLUMNS_BY_EVENT_TYPE",
    "DEVICES_REGISTERED",
    "DEVICES_UNREGISTERED",
    "EVENT_TYPES",
    "FOLD_INPUT_COLUMNS",
    "PENDING_KINDS",
    "SNAPSHOT_TABLE_NAMES",
    "STATE_FORMAT_VERSION",
    "STATE_TABLE_NAME",
    "FoldStats",
    "_digest",
    "content_digest",
    "device_rows",
    "dumps_state",
    "expire_pendings",
    "fold_bucket_arrow",
    "fold_device",
    "fold_output_schema",
    "is_empty_state",
    "loads_state",
    "new_device_state",
    "next_expiry",
]
