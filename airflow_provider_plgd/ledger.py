"""The interval ledger: what the stream holds for an interval, and how every stage accounts for it.

The ETL's ``plan`` task records, before anything is fetched, what the stream holds for the
interval (:func:`plan_record`); every later stage accounts for its input against that record,
and the ``summary`` task checks the whole chain (:func:`reconcile`)::

    stream holds T (plgd.>)  =  sum over owners n(owner)  +  unrouted U            plan
    n(owner)                 =  staged(owner) + skipped(owner, reason)              fetch
    U                        =  staged(_unrouted)  (exactly; the rest skipped as owned)  fetch (unrouted)
    sum staged               =  decoded D + quarantined Q                           decode (ledger's batches)
    D                        =  kept K + dropped (within the interval, seen before) dedupe

A stage that cannot account for every message raises
:class:`~airflow_provider_plgd.exceptions.LedgerError` naming the interval, the owner and the
numbers, and commits nothing. Counts come from the server (``JetStreamHook.acount_interval``), not
from what a stage happened to read.

Layout (``{root}`` a local path or fsspec URL; small JSON files, never XCom)::

    {root}/_ledger/{stream}/interval={interval_id}/
        stream.json              plan: stream identity, sequence range, counts per owner
        fetch/{group}.json       one per fetch task: per owner, the batches staged and what was skipped
        summary.json             the summary task: the whole chain and whether it adds up

Format of each file: ``docs/reliability.md`` ("The interval ledger"). Pure Python + fsspec (no
Airflow, no Spark): the decode application reads it on the driver.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from airflow_provider_plgd import staging, storage
from airflow_provider_plgd.exceptions import FewerMessagesError, IntervalGapError, LedgerError, NarrowerRerunError

#: Folder under the storage root that holds the ledgers.
LEDGER_DIR = "_ledger"
#: Version of the ledger files (bump on an incompatible change).
LEDGER_VERSION = 1
#: The subject filter whose messages the ETL accounts for (plgd publishes only under it; docs/wire-format.md §1).
SCOPE_FILTER = "plgd.>"
#: Owner partition of the messages whose subject is not under ``plgd.owners.<valid owner ID>.``.
UNROUTED_OWNER = "_unrouted"
#: Event-type partition of messages whose event type the fetch does not know (decode quarantines them).
UNKNOWN_EVENT_TYPE = "_unknown"
#: Skip reason: the event type is known but was not requested (the ``event_types`` param).
SKIP_NOT_REQUESTED = "event_type_not_requested"
#: Skip reason of the unrouted fetch: the message belongs to an owner's batch.
SKIP_OWNED = "staged_by_owner_fetch"


def owner_filter(owner_id: str) -> str:
    """The subject filter of every event of one owner: ``plgd.owners.{owner_id}.>`` (docs/wire-format.md §1)."""
    from airflow_provider_plgd.plgd.subjects import subject_filters

    (f,) = subject_filters(owner_id)
    return f


def interval_dir(root: str, stream: str, interval_id: str) -> str:
    """``{root}/_ledger/{stream}/interval={interval_id}`` (string join; works for paths and URLs).

    :raises ValueError: a stream or interval ID that is not safe in a path.
    """
    return storage.join_path(
        str(root), LEDGER_DIR, staging.validate_partition_value(stream, "stream"),
        f"interval={staging.validate_partition_value(interval_id, 'interval_id')}",
    )


def group_key(owner_ids: Iterable[str]) -> str:
    """File name (without ``.json``) of a fetch task's record: a hash of its owners (order kept)."""
    return "g" + hashlib.sha256("\n".join(owner_ids).encode()).hexdigest()[:16]


def write_json(path: str, value: Mapping[str, Any]) -> None:
    """Write ``value`` as JSON to ``path`` atomically (temp name + rename locally, one PUT on object stores)."""
    fs, p = storage.to_fs(path)
    storage.write_bytes_atomic(fs, p, (json.dumps(value, indent=1, sort_keys=True) + "\n").encode())


def read_json(path: str) -> dict[str, Any] | None:
    """Read a ledger file; ``None`` when it does not exist.

    :raises ValueError: not a JSON object, or a ledger version this code does not know (names the path).
    """
    fs, p = storage.to_fs(path)
    return storage.read_json_document(fs, p, "ledger file", LEDGER_VERSION)


# ------------------------------------------------------------------------------------------------
# plan
# ------------------------------------------------------------------------------------------------
def plan_record(counted: Mapping[str, Any], *, interval_id: str, bounds: Mapping[str, Any], owners: list[str],
                owners_discovered: bool, event_types: list[str], fetch_groups: int = 1) -> dict[str, Any]:
    """Build ``stream.json`` from ``JetStreamHook.acount_interval`` over ``[SCOPE_FILTER] + owner filters``.

    :param counted: the hook's answer (``stream``, ``created``, ``state``, ``first_seq``,
        ``end_seq_exclusive``, ``counts``).
    :param owners: the owners the run fetches; ``owners_discovered``: they were discovered from
        the stream (so every message under another subject must be staged as unrouted), or given
        by the user (other owners' messages are out of scope: ``not_requested``).
    :param fetch_groups: at most this many fetch tasks share the owners (:func:`owner_group`).
    :return: ``{"version", "interval_id", "stream", "stream_created", "bounds", "first_seq",
        "end_seq_exclusive", "seq_span", "deleted_in_range", "stream_state", "total",
        "owners": {owner: count}, "owners_discovered", "event_types", "unrouted", "not_requested",
        "fetch_groups"}`` (``fetch_groups``: the number of owner groups, ``len(chunk(owners, n))``).
    """
    counts = counted["counts"]
    total = int(counts[SCOPE_FILTER])
    per_owner = {o: int(counts[owner_filter(o)]) for o in owners}
    rest = total - sum(per_owner.values())
    span = int(counted["end_seq_exclusive"]) - int(counted["first_seq"])
    return {
        "version": LEDGER_VERSION,
        "interval_id": interval_id,
        "stream": counted["stream"],
        "stream_created": counted.get("created"),
        "bounds": dict(bounds),
        "first_seq": int(counted["first_seq"]),
        "end_seq_exclusive": int(counted["end_seq_exclusive"]),
        "seq_span": span,
        # sequences of the range that hold no message of any subject: deleted (num_deleted) or never used
        "deleted_in_range": max(0, span - int(counted.get("total", total))),
        "stream_state": dict(counted.get("state") or {}),
        "scope_filter": SCOPE_FILTER,
        "total": total,
        "owners": per_owner,
        "owners_discovered": bool(owners_discovered),
        "event_types": list(event_types),
        "unrouted": rest if owners_discovered else 0,
        "not_requested": 0 if owners_discovered else rest,
        "fetch_groups": len(chunk(list(owners), int(fetch_groups))),
    }


def owner_group(plan: Mapping[str, Any], index: int) -> list[str]:
    """The owners of fetch task ``index`` (0-based) of a plan record, in order.

    :raises ValueError: ``index`` outside ``0 .. fetch_groups - 1`` (names both).
    """
    groups = chunk(list(plan["owners"]), int(plan["fetch_groups"]))
    if not 0 <= int(index) < len(groups):
        raise ValueError(f"ledger group {index!r} does not exist: the plan of interval {plan['interval_id']} has "
                         f"{len(groups)} owner group(s)")
    return groups[int(index)]


def chunk(items: list, groups: int) -> list[list]:
    """Split ``items`` into at most ``groups`` contiguous, non-empty, near-equal chunks (order kept)."""
    if not items:
        return []
    groups = max(1, min(groups, len(items)))
    size, extra = divmod(len(items), groups)
    out, start = [], 0
    for i in range(groups):
        end = start + size + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return out



def check_not_fewer(previous: Mapping[str, Any] | None, new: Mapping[str, Any], *, accept_fewer: bool) -> list[str]:
    """Compare a new plan record with the interval's previous one.

    :return: the differences that lose messages (one line each, with the numbers); empty when the
        stream still holds at least as many messages for every owner and in total.
    :raises FewerMessagesError: there are such differences and ``accept_fewer`` is False. The
        message names the interval, the owners, both counts and both stream creation times (a
        different ``created`` means the stream was deleted and re-created).
    """
    if previous is None:
        return []
    lost = []
    if int(new["total"]) < int(previous["total"]):
        lost.append(f"total: the stream now holds {new['total']} messages of {SCOPE_FILTER}, "
                    f"the ledger recorded {previous['total']}")
    for owner, before in sorted((previous.get("owners") or {}).items()):
        now = new["owners"].get(owner)
        if now is not None and int(now) < int(before):
            lost.append(f"owner {owner}: now {now}, recorded {before}")
    if not lost or accept_fewer:
        return lost
    recreated = previous.get("stream_created") != new.get("stream_created")
    why = (f"stream {new['stream']!r} was re-created (created {new.get('stream_created')}, the ledger recorded "
           f"{previous.get('stream_created')})" if recreated else
           f"messages were removed from stream {new['stream']!r} (purge, max_msgs_per_subject or deletes; "
           f"{new['stream_state'].get('num_deleted') or 0} deleted sequences in the stream now)")
    raise FewerMessagesError(
        f"interval {new['interval_id']}: a rerun would replace committed data with fewer messages: {why}; "
        + "; ".join(lost[:20]) + ("; ..." if len(lost) > 20 else "")
        + ". Nothing was changed. If the loss is intended, rerun with the param accept_fewer_messages=true.",
        interval_id=new["interval_id"], problems=lost,
    )


def check_no_gap_before(root: str, stream: str, interval_id: str, *, dag_id: str = "<dag>") -> None:
    """Refuse an interval when the ledger has earlier time intervals but none ending at its start.

    Looks at the folders ``{root}/_ledger/{stream}/interval=<start>_<end>/`` whose interval ends at
    or before this one's start and that hold a ``stream.json`` (``plan`` of that interval ran): the
    latest end among them must be this interval's start. No earlier interval at all (the first run
    on this root) passes. A rerun of an older interval is checked the same way.

    :param interval_id: a time interval ID (``times.interval_id``); others are not checked.
    :param dag_id: named in the backfill command of the message.
    :raises IntervalGapError: ``[latest end, start)`` has no planned interval; the message names
        that range and the backfill that fills it.
    """
    from airflow_provider_plgd import times

    bounds = times.parse_interval_id(interval_id)
    if bounds["kind"] != "time":
        return
    start_ns = bounds["start_ns"]
    fs, base = storage.to_fs(storage.join_path(str(root), LEDGER_DIR, staging.validate_partition_value(stream,
                                                                                                    "stream")))
    try:
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(base, detail=False)]
    except FileNotFoundError:
        return
    ends = []
    for name in names:
        parsed = times.parse_interval_id(name[len("interval="):]) if name.startswith("interval=") else None
        if parsed and parsed["kind"] == "time" and parsed["end_ns"] <= start_ns:
            ends.append((parsed["end_ns"], name))
    for end_ns, name in sorted(ends, reverse=True):  # the latest planned one (its stream.json exists)
        if fs.exists(f"{base}/{name}/stream.json"):
            if end_ns == start_ns:
                return
            gap = (times.ns_to_rfc3339(end_ns), times.ns_to_rfc3339(start_ns))
            raise IntervalGapError(
                f"interval {interval_id}:\n"
                f"no interval of [{gap[0]}, {gap[1]}) was ever planned,\n"
                "so processing this one would build its snapshot without those events.\n"
                f"The latest planned interval before it ends at {gap[0]}. Nothing was written.\n"
                "Run the missing intervals and this one (empty intervals are processed too), oldest first:\n"
                f"  airflow backfill create --dag-id {dag_id} \\\n"
                f"    --from-date {gap[0]} --to-date {gap[1]} \\\n"
                "    --reprocess-behavior failed --max-active-runs 1\n"
                "See docs/operations.md, \"Holes in the interval chain\".",
                interval_id=interval_id, gap_start_ns=end_ns, gap_end_ns=start_ns)


def check_selection_covers(previous: Mapping[str, Any] | None, new: Mapping[str, Any]) -> None:
    """Refuse a plan record whose selection is narrower than the interval's previous one.

    A run replaces the interval's rows in ``events``, ``events_deduped`` and the snapshot, so it
    must select every owner with messages and every event type the earlier run covered: an earlier
    run over every discovered owner with unrouted messages needs one again (those are staged only
    when owners are discovered); owners the earlier run counted messages for must be selected; and
    so must its event types. A wider or equal selection passes.

    :raises NarrowerRerunError: naming the interval and what this run would leave out (at most 20
        names of each, with the counts).
    """
    if previous is None:
        return
    missing_owners = sorted(o for o, n in (previous.get("owners") or {}).items()
                            if int(n) and o not in new["owners"])
    unrouted_lost = int(previous.get("unrouted") or 0) and not new.get("owners_discovered")
    missing_types = sorted(set(previous.get("event_types") or []) - set(new.get("event_types") or []))
    if not (missing_owners or unrouted_lost or missing_types):
        return
    parts = []
    if missing_owners:
        parts.append(f"{len(missing_owners)} owner(s) with messages not selected now: "
                     + ", ".join(missing_owners[:20]) + (", ..." if len(missing_owners) > 20 else ""))
    if unrouted_lost:
        parts.append(f"the {previous['unrouted']} unrouted message(s), staged only when owners are discovered "
                     "(the owners param empty)")
    if missing_types:
        parts.append(f"{len(missing_types)} event type(s) not selected now: " + ", ".join(missing_types[:20])
                     + (", ..." if len(missing_types) > 20 else ""))
    raise NarrowerRerunError(
        f"interval {new['interval_id']}: this run selects less than the interval's earlier run ("
        + "; ".join(parts) + "). A run replaces the interval's rows in every table, so it would delete "
        "theirs; nothing was changed. Rerun with the same or a wider selection (the defaults: every owner "
        "and every event type).",
        interval_id=new["interval_id"], problems=parts,
    )


def selection_text(plan: Mapping[str, Any]) -> dict[str, Any]:
    """What a plan record selected, bounded for logs and XCom: ``{"owners": "all N discovered" | [≤ 20
    names], "owners_count", "event_types": "all N" | [names], "event_types_count"}``."""
    from airflow_provider_plgd.plgd.event_types import EVENT_TYPES

    owners, types = list(plan.get("owners") or []), list(plan.get("event_types") or [])
    return {
        "owners": f"all {len(owners)} discovered" if plan.get("owners_discovered") else owners[:20],
        "owners_count": len(owners),
        "event_types": f"all {len(types)}" if set(types) >= set(EVENT_TYPES) else types,
        "event_types_count": len(types),
    }


# ------------------------------------------------------------------------------------------------
# fetch
# ------------------------------------------------------------------------------------------------
def fetch_record(*, interval_id: str, stream: str, owners: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Build a fetch task's record.

    :param owners: ``{owner: {"expected": n (the ledger's count), "staged": s, "skipped": {reason: n},
        "batches": [{"event_type", "count", "bytes", "first_seq", "last_seq", "files", "path"}]}}``.
    """
    return {"version": LEDGER_VERSION, "interval_id": interval_id, "stream": stream, "owners": dict(owners)}


def owner_problems(owner: str, expected: int, staged: int, skipped: Mapping[str, int]) -> list[str]:
    """``[]`` when ``staged + sum(skipped) == expected``, else one line with the numbers."""
    got = int(staged) + sum(int(n) for n in skipped.values())
    if got == int(expected):
        return []
    return [f"owner {owner}: the stream holds {expected} messages, fetched {got} "
            f"(staged {staged}, skipped {dict(skipped) or 0})"]


def unrouted_problems(expected: int | None, staged: int) -> list[str]:
    """``[]`` unless the unrouted batch staged other than the ``expected`` messages the plan counted
    outside every owner (None: not checked). "Staged + skipped as owned" is not enough: a message
    skipped as an owner's that no owner fetch stages would vanish with the sums still right."""
    if expected is None or int(staged) == int(expected):
        return []
    return [f"unrouted: the stream holds {expected} messages outside every owner, the unrouted batch staged {staged}"]


def read_records(root: str, stream: str, interval_id: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The interval's plan record (or None) and its fetch records (sorted by file name)."""
    base = interval_dir(root, stream, interval_id)
    plan = read_json(storage.join_path(base, "stream.json"))
    fs, p = storage.to_fs(storage.join_path(base, "fetch"))
    try:
        names = sorted(str(x) for x in fs.ls(p, detail=False) if str(x).endswith(".json"))
    except FileNotFoundError:
        names = []
    records = [read_json(storage.location_url(fs, name)) for name in names]
    return plan, [r for r in records if r is not None]


def clear_fetch_records(root: str, stream: str, interval_id: str) -> None:
    """Delete the interval's fetch records (plan does, so a rerun's records are its own)."""
    fs, p = storage.to_fs(storage.join_path(interval_dir(root, stream, interval_id), "fetch"))
    if fs.exists(p):
        fs.rm(p, recursive=True)


def staged_batches(plan: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The batches the ledger names, checked against the plan: ``[{owner_id, event_type, count}]``.

    :raises LedgerError: an owner of the plan has no fetch record, an owner's record does not add
        up, or the unrouted messages were not staged (names the interval, owners and numbers).
    """
    interval_id = plan["interval_id"]
    by_owner: dict[str, Mapping[str, Any]] = {}
    for record in records:
        by_owner.update(record.get("owners") or {})
    problems: list[str] = []
    batches: list[dict[str, Any]] = []
    expected = dict(plan["owners"])
    if int(plan.get("unrouted") or 0):
        expected[UNROUTED_OWNER] = int(plan["total"])
    for owner, count in sorted(expected.items()):
        got = by_owner.get(owner)
        if got is None:
            problems.append(f"owner {owner}: the stream holds {count} messages, no fetch task recorded it")
            continue
        problems += owner_problems(owner, count, got["staged"], got.get("skipped") or {})
        if owner == UNROUTED_OWNER:
            problems += unrouted_problems(plan["unrouted"], got["staged"])
        batches += [{"owner_id": owner, "event_type": b["event_type"], "count": int(b["count"])}
                    for b in got.get("batches") or []]
    if problems:
        raise LedgerError(f"interval {interval_id}: the fetch does not account for every message: "
                          + "; ".join(problems[:20]), interval_id=interval_id, problems=problems)
    return batches


# ------------------------------------------------------------------------------------------------
# the whole chain
# ------------------------------------------------------------------------------------------------
def reconcile(root: str, stream: str, interval_id: str, apps: Mapping[str, Mapping[str, Any] | None]) -> dict[str, Any]:
    """Check the whole chain of one interval and write ``summary.json``.

    :param apps: the run summaries of ``decode``, ``dedupe`` and ``rebuild`` (``run_summary``).
    :return: ``{"version", "interval_id", "stream", "chain": {...numbers...}, "per_owner":
        {owner: {event_type: staged}} (non-zero only), "problems": [str], "reconciled": bool}``;
        ``reconciled`` is False when any problem was found (the caller fails the run).
    """
    plan, records = read_records(root, stream, interval_id)
    if plan is None:
        return {"version": LEDGER_VERSION, "interval_id": interval_id, "stream": stream, "chain": {},
                "per_owner": {}, "reconciled": False,
                "problems": [f"no ledger at {interval_dir(root, stream, interval_id)} (the plan task writes it)"]}
    problems: list[str] = []
    try:
        batches = staged_batches(plan, records)
    except LedgerError as exc:
        problems += exc.problems
        batches = []
    staged = sum(b["count"] for b in batches)
    per_owner: dict[str, dict[str, int]] = {}
    for b in batches:
        if b["count"]:
            per_owner.setdefault(b["owner_id"], {})[b["event_type"]] = b["count"]
    skipped: dict[str, int] = {}
    for record in records:
        for owner, got in (record.get("owners") or {}).items():
            if owner == UNROUTED_OWNER:
                continue
            for reason, n in (got.get("skipped") or {}).items():
                skipped[reason] = skipped.get(reason, 0) + int(n)
    decode, dedupe = apps.get("decode") or {}, apps.get("dedupe") or {}
    if plan.get("spark_skip") and not decode and not dedupe:
        # an empty interval whose Spark tasks were skipped (etl.spark_skip_reason): nothing to decode
        # or deduplicate, and the fetch must have staged nothing (checked below: 0 = 0)
        decode = {"fetched": 0, "decoded": 0, "quarantined": 0, "per_reason": {}, "skipped": plan["spark_skip"]}
        dedupe = {"input": 0, "output": 0, "duplicates": 0, "within_batch_duplicates": 0,
                  "cross_batch_duplicates": 0, "skipped": plan["spark_skip"]}
    if not decode:
        problems.append("decode: no run summary")
    else:
        if int(decode.get("fetched", -1)) != staged:
            problems.append(f"decode read {decode.get('fetched')} staged messages, the fetch staged {staged}")
        if int(decode.get("decoded", 0)) + int(decode.get("quarantined", 0)) != int(decode.get("fetched", -1)):
            problems.append(f"decode: {decode.get('fetched')} read != {decode.get('decoded')} decoded + "
                            f"{decode.get('quarantined')} quarantined")
    if not dedupe:
        problems.append("dedupe: no run summary")
    elif decode:
        if int(dedupe.get("input", -1)) != int(decode.get("decoded", -2)):
            problems.append(f"dedupe read {dedupe.get('input')} events, decode wrote {decode.get('decoded')}")
        if int(dedupe.get("output", 0)) + int(dedupe.get("duplicates", 0)) != int(dedupe.get("input", -1)):
            problems.append(f"dedupe: {dedupe.get('input')} read != {dedupe.get('output')} kept + "
                            f"{dedupe.get('duplicates')} duplicates dropped")
    chain = {
        "stream_total": plan["total"],
        "owners": len(plan["owners"]),
        "unrouted": plan.get("unrouted", 0),
        "not_requested_owners_messages": plan.get("not_requested", 0),
        "deleted_in_range": plan.get("deleted_in_range", 0),
        "staged": staged,
        "skipped": skipped,
        "decoded": decode.get("decoded"),
        "quarantined": decode.get("quarantined"),
        "quarantined_per_reason": decode.get("per_reason"),
        "dedupe_input": dedupe.get("input"),
        "kept": dedupe.get("output"),
        "duplicates_within_interval": dedupe.get("within_batch_duplicates"),
        "duplicates_seen_before": dedupe.get("cross_batch_duplicates"),
        "snapshot_version": (apps.get("rebuild") or {}).get("version"),
        "spark_skipped": plan.get("spark_skip"),
        "selection": selection_text(plan),
    }
    result = {"version": LEDGER_VERSION, "interval_id": interval_id, "stream": stream, "chain": chain,
              "problems": problems, "reconciled": not problems}
    write_json(storage.join_path(interval_dir(root, stream, interval_id), "summary.json"), result)
    return {**result, "per_owner": per_owner}
