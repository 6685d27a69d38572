"""An owner ID is checked once where it enters (``fetch.selection.Selection.of``: the owner rule
``plgd.subjects.validate_owner_id``); the subject filters built from it do not check it again, and
the owner-wide filter ``plgd.owners.{owner}.>`` has one builder (``plgd.subjects.owner_filter``)."""

from __future__ import annotations

from airflow_provider_plgd.fetch.selection import Selection
from airflow_provider_plgd.plgd import subjects
from airflow_provider_plgd.tables import ledger

OWNER = "e1407479-3136-56c0-9908-bb02fb0339e2"


def test_an_owner_id_passes_the_token_rule_once_per_selection(monkeypatch):
    seen: list[str] = []
    rule = subjects.validate_token

    def counting(value, what):
        if what == "owner_id":
            seen.append(value)
        return rule(value, what)

    monkeypatch.setattr(subjects, "validate_token", counting)
    targets = Selection.of([OWNER], ["devicesregistered", "resourcechanged", "devicemetadataupdated"]) \
        .targets(owner_wide=True)
    assert seen == [OWNER]
    assert [t.filters for t in targets] == [
        [f"plgd.owners.{OWNER}.registrations.devicesregistered"],
        [f"plgd.owners.{OWNER}.devices.*.resources.*.resourcechanged",
         f"plgd.owners.{OWNER}.devices.*.resources.*.resourcechanged.>"],
        [f"plgd.owners.{OWNER}.devices.*.metadata.devicemetadataupdated"],
        [f"plgd.owners.{OWNER}.>"],
    ]


def test_one_builder_of_the_owner_filter():
    assert subjects.owner_filter(OWNER) == f"plgd.owners.{OWNER}.>" == ledger.owner_filter(OWNER)
    assert subjects.subject_filters(OWNER) == [subjects.owner_filter(OWNER)]
    assert ledger.read_filter(OWNER) == subjects.owner_filter(OWNER)
    assert ledger.read_filter(ledger.UNROUTED_OWNER) == ledger.SCOPE_FILTER
