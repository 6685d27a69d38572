"""fetch.selection: owners and event types are checked once, and the targets follow from them."""

from __future__ import annotations

import pytest

from airflow_provider_plgd.fetch.selection import Selection, Target, filter_targets, owner_groups, unrouted_targets
from airflow_provider_plgd.tables import ledger, staging

O1 = "e1407479-3136-56c0-9908-bb02fb0339e2"
O2 = "2b2b0f3a-0000-5000-8000-000000000002"


def test_targets_of_a_selection():
    selection = Selection.of([O1, O2], ["devicesregistered", "resourcechanged"])
    assert selection == Selection((O1, O2), ("devicesregistered", "resourcechanged"))
    single = selection.targets(owner_wide=False)
    assert single[0] == Target(O1, "devicesregistered", [f"plgd.owners.{O1}.registrations.devicesregistered"])
    assert single[1] == Target(O1, "resourcechanged", [f"plgd.owners.{O1}.devices.*.resources.*.resourcechanged",
                                                       f"plgd.owners.{O1}.devices.*.resources.*.resourcechanged.>"])
    assert [(t.owner, t.event_type) for t in selection.targets(owner_wide=True)] == [
        (O1, "devicesregistered"), (O1, "resourcechanged"), (O1, ledger.UNKNOWN_EVENT_TYPE),
        (O2, "devicesregistered"), (O2, "resourcechanged"), (O2, ledger.UNKNOWN_EVENT_TYPE)]
    groups = owner_groups(selection.targets(owner_wide=True) + filter_targets(["plgd.>"]))
    assert [[t.owner for t in g] for g in groups] == [[O1] * 3, [O2] * 3, [staging.FILTER_OWNER]]
    assert unrouted_targets() == [Target(ledger.UNROUTED_OWNER, ledger.UNKNOWN_EVENT_TYPE, [ledger.SCOPE_FILTER])]


@pytest.mark.parametrize("owners,event_types,named", [
    (["*"], ["devicesregistered"], "owner_id '*'"),
    ([O1, "../x"], ["devicesregistered"], "owner_id '../x'"),
    ([O1], ["a.b"], "event_type 'a.b'"),
    ([O1], ["nosuchevent"], "'nosuchevent'"),
])
def test_selection_names_the_bad_value(owners, event_types, named):
    with pytest.raises(ValueError) as err:
        Selection.of(owners, event_types)
    assert named in str(err.value)
    with pytest.raises(ValueError, match="owner_id"):
        Selection.of([], ["devicesregistered"]).with_owners(["a b"])


def test_filter_targets_check_each_filter():
    assert filter_targets(["plgd.>"]) == [Target(staging.FILTER_OWNER, staging.filter_key(["plgd.>"]), ["plgd.>"])]
    with pytest.raises(ValueError, match=r"subject_filter 'plgd\. >' is not a valid NATS filter"):
        filter_targets(["plgd.>", "plgd. >"])
