"""NATS subjects of plgd hub events: build, parse, and JetStream filter subjects.

Templates (docs/wire-format.md §1.1, plgd hub v2.25.0):

* S1 ``plgd.owners.{ownerId}.registrations.{eventType}``
* S2 ``plgd.owners.{ownerId}.devices.{deviceId}.resource-links.{eventType}``
* S3 ``plgd.owners.{ownerId}.devices.{deviceId}.metadata.{eventType}``
* S4 ``plgd.owners.{ownerId}.devices.{deviceId}.resources.{hrefId}.{eventType}``
* S5 ``...resources.{hrefId}.{eventType}.leadrt.{leadResourceType}`` (lead type may span tokens)
* S6 ``...resources.{hrefId}.{eventType}.leadrt`` (feature on, no lead type chosen)

This module is the one home of the literal tokens ``plgd``, ``owners``, ``devices`` and
``leadrt``; the four family tokens are defined in :mod:`.event_types` (``FAMILY_*``).
Token values come from :mod:`.ids` (``owner_id``, ``href_id``).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

from .event_types import (
    EVENT_TYPES,
    FAMILY_METADATA,
    FAMILY_REGISTRATIONS,
    FAMILY_RESOURCE_LINKS,
    FAMILY_RESOURCES,
    event_type_info,
)

__all__ = [
    "LEADRT",
    "TOKEN_DEVICES",
    "TOKEN_OWNERS",
    "TOKEN_PLGD",
    "Subject",
    "check_filter_subject",
    "links_subject",
    "metadata_subject",
    "owner_event_filters",
    "owner_filter",
    "parse_subject",
    "registrations_subject",
    "resource_subject",
    "subject_filters",
    "subject_matches",
    "subject_owner",
    "validate_owner_id",
    "validate_token",
]

TOKEN_PLGD = "plgd"
TOKEN_OWNERS = "owners"
TOKEN_DEVICES = "devices"
LEADRT = "leadrt"

_PREFIX = f"{TOKEN_PLGD}.{TOKEN_OWNERS}."
_WILDCARD = "*"
_FULL_WILDCARD = ">"

# Token rule of validate_token: no '.', '*', '>' (subject syntax), no '/', '\\', '=' (staging
# paths: separators and the partition key/value separator), no '?', '[', ']' (glob patterns of
# staging listings), no whitespace or control characters.
_BAD_TOKEN_CHAR = re.compile(r"[.*>/\\=?\[\]\s\x00-\x1f\x7f-\x9f]")
# A lead resource type may contain '.', but no empty token, wildcard, whitespace or control chars.
_BAD_LEAD_CHAR = re.compile(r"[*>\s\x00-\x1f\x7f-\x9f]")


def subject_matches(subject_filter: str, subject: str) -> bool:
    """Whether ``subject`` matches the NATS filter subject ``subject_filter``.

    ``*`` matches exactly one token; a final ``>`` matches one or more trailing tokens; other
    tokens match literally. Source: NATS docs, "Subject-Based Messaging > Wildcards".
    """
    pattern, tokens = subject_filter.split("."), subject.split(".")
    for i, p in enumerate(pattern):
        if p == ">":
            return len(tokens) > i
        if i >= len(tokens) or (p != "*" and p != tokens[i]):
            return False
    return len(tokens) == len(pattern)


def check_filter_subject(value: str, what: str = "filter") -> str:
    """Return ``value`` if it is a NATS filter subject, else raise ValueError naming ``what`` and it.

    A filter subject is dot-separated non-empty tokens without whitespace or control characters;
    ``*`` and ``>`` are wildcards only as whole tokens, and ``>`` only as the last one. Source: NATS
    docs, "Subject-Based Messaging > Wildcards" (the server refuses other filters).
    """
    tokens = value.split(".") if isinstance(value, str) else []
    if (
        not tokens
        or any(c.isspace() or ord(c) < 32 for c in value)
        or any(not t for t in tokens)
        or any(t == ">" for t in tokens[:-1])
        or any(len(t) > 1 and ("*" in t or ">" in t) for t in tokens)
    ):
        raise ValueError(
            f"{what} {value!r} is not a valid NATS filter subject (expected non-empty dot-separated tokens "
            "without whitespace, '*' and '>' only as whole tokens and '>' last, e.g. 'plgd.owners.*.>')"
        )
    return value


#: First character of the names this project reserves for its own partitions (``_unrouted``,
#: ``_unknown``): never the first character of an owner ID (:func:`validate_owner_id`).
RESERVED_PREFIX = "_"
#: What nats-py puts in place of bytes of a subject that are not UTF-8 (``errors="replace"``):
#: such a subject's token cannot be written back as a filter that matches the stored bytes.
REPLACEMENT_CHARACTER = "\ufffd"


def validate_owner_id(value: str, what: str = "owner_id") -> str:
    """Return ``value`` if it can be an owner ID: a valid token (:func:`validate_token`) that
    neither starts with :data:`RESERVED_PREFIX` (our own partition names) nor holds U+FFFD (a
    subject whose bytes were not UTF-8: its filter ``plgd.owners.<token>.>`` would match nothing).

    plgd owner IDs are user IDs of the OAuth provider (UUIDs in practice); a subject whose owner token
    fails this rule is not routed to an owner: the ETL stages it as unrouted and quarantines it
    (``bad_subject``).

    :raises ValueError: naming ``what`` and the value. :raises TypeError: not a str.
    """
    validate_token(value, what)
    if value.startswith(RESERVED_PREFIX):
        raise ValueError(f"{what} {value!r} starts with {RESERVED_PREFIX!r}, which is reserved for the ETL's own "
                         "partitions (_unrouted, _unknown)")
    if REPLACEMENT_CHARACTER in value:
        raise ValueError(f"{what} {value!r} holds U+FFFD: the subject's bytes were not UTF-8")
    return value


def subject_owner(subject: str) -> str | None:
    """The owner ID of a subject under ``plgd.owners.<owner_id>.`` (at least one token after it),
    or None when the subject is elsewhere or its owner token is not an owner ID (:func:`validate_owner_id`).

    JetStream stores messages published on subjects such as ``plgd.owners.*.registrations.x``
    literally; such a token must never become a subscription wildcard or a staging folder.
    """
    tokens = subject.split(".", 3)
    if len(tokens) < 4 or tokens[0] != TOKEN_PLGD or tokens[1] != TOKEN_OWNERS:
        return None
    try:
        return validate_owner_id(tokens[2])
    except (TypeError, ValueError):
        return None


def validate_token(value: object, what: str) -> str:
    """Return ``value`` if it can be one NATS subject token and one staging path segment, else
    raise ValueError.

    Values such as owner IDs and event types become both a subject token
    (``plgd.owners.{owner_id}.…``) and a folder (``owner_id={owner_id}``), so a valid token can
    neither widen a subscription nor leave the storage root. Rejected: a non-str (TypeError), the
    empty string, and any value containing ``.`` (so also ``..``), ``*``, ``>``, ``/``, ``\\``,
    ``=``, ``?``, ``[``, ``]``, whitespace (including Unicode spaces), or control/format
    characters (Unicode category C, e.g. NUL, DEL, U+202E). plgd's own tokens are UUIDs and event
    type names (docs/wire-format.md §1), which never contain these. The error message names ``what``
    (e.g. ``"device_id"``) and the value.
    """
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}: {value!r}")
    if not value:
        raise ValueError(f"{what} must not be empty")
    bad = _BAD_TOKEN_CHAR.search(value)
    if bad is None and not value.isascii():
        bad_char = next((c for c in value if unicodedata.category(c).startswith("C")), None)
    else:
        bad_char = bad.group() if bad is not None else None
    if bad_char is not None:
        raise ValueError(
            f"{what} {value!r} is not a valid NATS subject token: contains {bad_char!r} "
            "(no '.', '*', '>', '/', '\\', '=', '?', '[', ']', whitespace or control characters allowed)"
        )
    return value


def _validate_lead_resource_type(value: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"lead_resource_type must be a str, got {type(value).__name__}: {value!r}")
    bad = _BAD_LEAD_CHAR.search(value)
    if bad is not None or "" in value.split("."):
        raise ValueError(
            f"lead_resource_type {value!r} cannot end a subject: expected dot-separated non-empty "
            "tokens without '*', '>', whitespace or control characters "
            "(use lead_resource_type.lead_resource_type_token() to replace '*', '>', '$')"
        )
    return value


@dataclass(frozen=True, slots=True)
class Subject:
    """A parsed plgd subject (docs/wire-format.md §1.1). ``str(subject)`` renders it back.

    :ivar family: ``"registrations"`` (S1), ``"resource-links"`` (S2), ``"metadata"`` (S3) or
        ``"resources"`` (S4-S6).
    :ivar owner_id: the ``ownerId`` token as it appears (see ``ids.owner_id``).
    :ivar event_type: the ``eventType`` token.
    :ivar device_id: the ``deviceId`` token; None for ``registrations``.
    :ivar href_id: the ``hrefId`` token (``uuid5(URL, href)``); only for ``resources``.
    :ivar leadrt: the subject has the ``.leadrt`` suffix (S5 or S6).
    :ivar lead_resource_type: everything after ``.leadrt.`` joined by ``.`` (S5), else None.
    """

    family: str
    owner_id: str
    event_type: str
    device_id: str | None = None
    href_id: str | None = None
    leadrt: bool = False
    lead_resource_type: str | None = None

    def __str__(self) -> str:
        family = self.family
        if family == FAMILY_REGISTRATIONS:
            return f"{_PREFIX}{self.owner_id}.{family}.{self.event_type}"
        head = f"{_PREFIX}{self.owner_id}.{TOKEN_DEVICES}.{self.device_id}.{family}."
        if family != FAMILY_RESOURCES:
            return f"{head}{self.event_type}"
        subject = f"{head}{self.href_id}.{self.event_type}"
        if self.lead_resource_type:
            return f"{subject}.{LEADRT}.{self.lead_resource_type}"
        if self.leadrt:
            return f"{subject}.{LEADRT}"
        return subject


def _check_family(event_type: str, family: str) -> str:
    info = event_type_info(event_type)
    if info.family != family:
        raise ValueError(
            f"event type {event_type!r} belongs to subject family {info.family!r}, not {family!r}"
        )
    return event_type


def registrations_subject(owner_id: str, event_type: str) -> str:
    """S1 ``plgd.owners.{owner_id}.registrations.{event_type}`` (identity-store events).

    ``owner_id`` is the subject token (use ``ids.owner_id(owner)`` for a raw owner).
    Raises ValueError if a token is invalid (``validate_token``) or ``event_type`` is not
    ``devicesregistered``/``devicesunregistered``.
    """
    validate_token(owner_id, "owner_id")
    _check_family(event_type, FAMILY_REGISTRATIONS)
    return f"{_PREFIX}{owner_id}.{FAMILY_REGISTRATIONS}.{event_type}"


def links_subject(owner_id: str, device_id: str, event_type: str) -> str:
    """S2 ``plgd.owners.{owner_id}.devices.{device_id}.resource-links.{event_type}``.

    Raises ValueError for an invalid token or an event type that is not a resource-links type.
    """
    validate_token(owner_id, "owner_id")
    validate_token(device_id, "device_id")
    _check_family(event_type, FAMILY_RESOURCE_LINKS)
    return f"{_PREFIX}{owner_id}.{TOKEN_DEVICES}.{device_id}.{FAMILY_RESOURCE_LINKS}.{event_type}"


def metadata_subject(owner_id: str, device_id: str, event_type: str) -> str:
    """S3 ``plgd.owners.{owner_id}.devices.{device_id}.metadata.{event_type}``.

    Raises ValueError for an invalid token or an event type that is not a device-metadata type.
    """
    validate_token(owner_id, "owner_id")
    validate_token(device_id, "device_id")
    _check_family(event_type, FAMILY_METADATA)
    return f"{_PREFIX}{owner_id}.{TOKEN_DEVICES}.{device_id}.{FAMILY_METADATA}.{event_type}"


def resource_subject(
    owner_id: str,
    device_id: str,
    href_id: str,
    event_type: str,
    *,
    leadrt: bool = False,
    lead_resource_type: str | None = None,
) -> str:
    """S4/S5/S6 subject of a resource event.

    * ``leadrt=False`` and no lead type: S4 ``...resources.{href_id}.{event_type}``
    * a non-empty ``lead_resource_type``: S5 ``....{event_type}.leadrt.{lead_resource_type}``
      (implies ``leadrt``; pass the token from ``lead_resource_type_token``, it may contain ``.``)
    * ``leadrt=True`` without lead type (None or ``""``): S6 ``....{event_type}.leadrt``

    ``href_id`` is the token ``ids.href_id(href)``, not the href.
    Raises ValueError for an invalid token, a non-resource event type, or a lead type that
    cannot end a subject (contains ``*``, ``>``, whitespace, control characters or empty tokens).
    """
    validate_token(owner_id, "owner_id")
    validate_token(device_id, "device_id")
    validate_token(href_id, "href_id")
    _check_family(event_type, FAMILY_RESOURCES)
    subject = (
        f"{_PREFIX}{owner_id}.{TOKEN_DEVICES}.{device_id}.{FAMILY_RESOURCES}.{href_id}.{event_type}"
    )
    if lead_resource_type:
        return f"{subject}.{LEADRT}.{_validate_lead_resource_type(lead_resource_type)}"
    if lead_resource_type is not None and not isinstance(lead_resource_type, str):
        raise TypeError(f"lead_resource_type must be a str or None, got {lead_resource_type!r}")
    if leadrt:
        return f"{subject}.{LEADRT}"
    return subject


def _bad(subject: object, why: str) -> ValueError:
    return ValueError(f"not a plgd event subject: {subject!r} ({why})")


@lru_cache(maxsize=1 << 16)
def _parse(subject: str, check_event_type: bool) -> Subject:
    if not isinstance(subject, str):
        raise TypeError(f"subject must be a str, got {type(subject).__name__}: {subject!r}")
    if not subject.startswith(_PREFIX):
        raise _bad(subject, f"expected it to start with {_PREFIX!r}")
    if _WILDCARD in subject or _FULL_WILDCARD in subject:
        raise _bad(subject, "wildcards '*'/'>' cannot appear in a message subject")
    if "\ufffd" in subject:  # how the fetch (and the server's JSON API) shows bytes that are not UTF-8
        raise _bad(subject, "U+FFFD in place of bytes that are not valid UTF-8")
    tokens = subject.split(".")
    n = len(tokens)
    if "" in tokens:
        raise _bad(subject, "empty token")
    if n < 5:
        raise _bad(subject, "too few tokens")
    owner = tokens[2]
    if owner.startswith(RESERVED_PREFIX):  # validate_owner_id: never an owner, staged as unrouted
        raise _bad(subject, f"the owner token starts with {RESERVED_PREFIX!r}, which is reserved for the ETL's "
                            "own partitions")
    if tokens[3] == FAMILY_REGISTRATIONS:
        if n != 5:
            raise _bad(subject, "registrations subjects have 5 tokens")
        result = Subject(FAMILY_REGISTRATIONS, owner, tokens[4])
    elif tokens[3] == TOKEN_DEVICES:
        if n < 7:
            raise _bad(subject, "too few tokens for a device subject")
        family = tokens[5]
        if family == FAMILY_RESOURCES:
            if n < 8:
                raise _bad(subject, "too few tokens for a resource subject")
            if n == 8:
                result = Subject(family, owner, tokens[7], tokens[4], tokens[6])
            elif tokens[8] != LEADRT:
                raise _bad(subject, f"expected {LEADRT!r} after the event type")
            elif n == 9:
                result = Subject(family, owner, tokens[7], tokens[4], tokens[6], True)
            else:
                lead = ".".join(tokens[9:])
                result = Subject(family, owner, tokens[7], tokens[4], tokens[6], True, lead)
        elif family in (FAMILY_RESOURCE_LINKS, FAMILY_METADATA):
            if n != 7:
                raise _bad(subject, f"{family} subjects have 7 tokens")
            result = Subject(family, owner, tokens[6], tokens[4])
        else:
            raise _bad(
                subject,
                f"token 6 must be one of {FAMILY_RESOURCE_LINKS!r}, {FAMILY_METADATA!r}, "
                f"{FAMILY_RESOURCES!r}, got {family!r}",
            )
    else:
        raise _bad(
            subject,
            f"token 4 must be {FAMILY_REGISTRATIONS!r} or {TOKEN_DEVICES!r}, got {tokens[3]!r}",
        )
    if check_event_type:
        info = EVENT_TYPES.get(result.event_type)
        if info is None:
            raise _bad(subject, f"unknown event type {result.event_type!r}")
        if info.family != result.family:
            raise _bad(
                subject,
                f"event type {result.event_type!r} belongs to family {info.family!r}, "
                f"not {result.family!r}",
            )
    return result


def parse_subject(subject: str, *, check_event_type: bool = True) -> Subject:
    """Parse a plgd subject (S1-S6, docs/wire-format.md §1.1 and the parsing tip in §1.4).

    Tokens are split on ``.``; for resources everything after the ``leadrt`` token, joined by
    ``.``, is the lead resource type (``...resourcechanged.leadrt.core.light`` ->
    ``lead_resource_type="core.light"``). Results are cached (subjects repeat per resource).

    :param check_event_type: also require the event type to be one of ``EVENT_TYPES`` and to
        belong to the subject's family (default). The codec passes False so it can report an
        unknown event type separately from a malformed subject.
    :raises ValueError: naming the subject, for any other shape: wrong prefix, empty tokens,
        wildcards, wrong token count, unknown family token, missing ``leadrt``, bad event type.
    :raises TypeError: ``subject`` is not a str.
    """
    return _parse(subject, check_event_type)


def owner_filter(owner_id: str) -> str:
    """The filter subject of every event of one owner: ``plgd.owners.{owner_id}.>`` (S1-S6 all start
    with ``plgd.owners.{owner_id}.``). The one place this filter is built.

    :param owner_id: an owner ID checked where it entered (:func:`validate_owner_id`; the fetch's
        ``Selection``), or ``"*"``; not checked again here.
    """
    return f"{_PREFIX}{owner_id}.{_FULL_WILDCARD}"


def subject_filters(owner_id: str = "*", event_type: str | None = None) -> list[str]:
    """JetStream filter subjects that together match exactly one owner's events of one type.

    Use one consumer per returned filter.

    * ``event_type=None``: ``["plgd.owners.{owner_id}.>"]`` (all families).
    * ``devicesregistered``/``devicesunregistered``: ``["plgd.owners.{o}.registrations.{et}"]``.
    * resource-links / metadata types: ``["plgd.owners.{o}.devices.*.resource-links.{et}"]`` /
      ``[...".metadata.{et}"]``.
    * resource types need two (S4 and the ``.leadrt`` forms S5/S6):
      ``["plgd.owners.{o}.devices.*.resources.*.{et}", "plgd.owners.{o}.devices.*.resources.*.{et}.>"]``.

    :param owner_id: the ``ownerId`` token (``ids.owner_id(owner)``) or ``"*"`` for all owners.
    :raises ValueError: ``owner_id`` is neither ``"*"`` nor a valid token; ``event_type`` is not
        one of ``EVENT_TYPES``.
    """
    if owner_id != _WILDCARD:
        validate_token(owner_id, "owner_id")
    return owner_event_filters(owner_id, event_type)


def owner_event_filters(owner_id: str, event_type: str | None = None) -> list[str]:
    """:func:`subject_filters` of an owner ID checked where it entered (:func:`validate_owner_id`,
    the fetch's ``Selection``): the owner ID is not checked again.

    :raises ValueError: ``event_type`` is not one of ``EVENT_TYPES``.
    """
    if event_type is None:
        return [owner_filter(owner_id)]
    base = f"{_PREFIX}{owner_id}"
    info = event_type_info(event_type)
    if info.family == FAMILY_REGISTRATIONS:
        return [f"{base}.{FAMILY_REGISTRATIONS}.{event_type}"]
    devices = f"{base}.{TOKEN_DEVICES}.{_WILDCARD}.{info.family}"
    if info.family == FAMILY_RESOURCES:
        one = f"{devices}.{_WILDCARD}.{event_type}"
        return [one, f"{one}.{_FULL_WILDCARD}"]
    return [f"{devices}.{event_type}"]

