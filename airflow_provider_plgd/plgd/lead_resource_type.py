"""The lead resource type of a resource subject (docs/wire-format.md §1.3): the token plgd's
resource-aggregate puts after ``.leadrt.`` (:func:`select_lead_resource_type`), in subject form
(:func:`lead_resource_type_token`). Subjects themselves: :mod:`.subjects`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from .ids import uuid5_url

__all__ = ["lead_resource_type_token", "select_lead_resource_type"]

_LEAD_REPLACE = str.maketrans({"*": "_", ">": "_", "$": "_"})


def lead_resource_type_token(resource_type: str, *, use_uuid: bool = False) -> str:
    """Subject form of a chosen lead resource type (docs/wire-format.md §1.3 step 4).

    Each ``*``, ``>`` and ``$`` becomes ``_`` (nothing else is escaped, so ``.`` stays and the
    value may span several subject tokens). With ``use_uuid`` and a non-empty result, returns
    ``uuid5(NAMESPACE_URL, replaced)`` instead (hash computed after the replacement).
    Examples: ``"core.light"`` -> ``"core.light"``; with ``use_uuid`` ->
    ``"6ed09a04-e205-5403-82cf-b999b53ad325"``. Raises TypeError for a non-str.
    """
    if not isinstance(resource_type, str):
        raise TypeError(
            f"resource_type must be a str, got {type(resource_type).__name__}: {resource_type!r}"
        )
    replaced = resource_type.translate(_LEAD_REPLACE)
    if use_uuid and replaced:
        return uuid5_url(replaced)
    return replaced


def select_lead_resource_type(
    resource_types: Iterable[str],
    *,
    regex_filter: Iterable[str] = (),
    filter: str = "",  # plgd's config key name
    use_uuid: bool = False,
) -> str | None:
    """Lead resource type token the resource-aggregate puts after ``.leadrt.`` (docs/wire-format.md §1.3).

    :param resource_types: the event's ``resource_types`` in order.
    :param regex_filter: plgd ``regexFilter``; the first type (in event order) that matches any
        pattern wins. Patterns are applied with Python ``re.search`` (Go ``MatchString`` is also an
        unanchored search; syntax differences between Go RE2 and Python ``re`` are not handled).
    :param filter: plgd ``filter``: ``""``, ``"first"`` or ``"last"``; used when no regex matched.
    :param use_uuid: plgd ``useUUID``.
    :return: the token (after ``lead_resource_type_token``), or None when no type is chosen
        (then the subject is S6, bare ``.leadrt``).
    :raises ValueError: ``filter`` is not ``""``, ``"first"`` or ``"last"``.
    """
    if filter not in ("", "first", "last"):
        raise ValueError(f"filter must be '', 'first' or 'last', got {filter!r}")
    types = list(resource_types)
    if not types:
        return None
    chosen: str | None = None
    patterns = [re.compile(p) for p in regex_filter]
    if patterns:
        chosen = next((t for t in types if any(p.search(t) for p in patterns)), None)
    if chosen is None:
        if filter == "first":
            chosen = types[0]
        elif filter == "last":
            chosen = types[-1]
    if chosen is None:
        return None
    token = lead_resource_type_token(chosen, use_uuid=use_uuid)
    return token or None
