"""The test harness's own assumption about Airflow (``conftest.dag_test_polls_on_progress``).

The fixture recognises the 1 s sleep of ``DAG.test`` by the caller's function name, file and its
local ``all_tis``. If an Airflow release moves or rewrites ``DAG.test``, the fixture would stop
skipping the sleep without failing anything, and every refused ``dag.test()`` would again take
about 7 s more. This test fails instead, naming what changed.
"""

from __future__ import annotations

from tests.integration.conftest import _DAG_TEST_FILE


def test_dag_test_is_where_the_poll_fixture_looks_for_it() -> None:
    from airflow.sdk import DAG

    code = DAG.test.__code__
    assert code.co_name == "test"
    assert code.co_filename.endswith(_DAG_TEST_FILE), (
        f"DAG.test moved to {code.co_filename}, expected a file ending in {_DAG_TEST_FILE}: update "
        "_DAG_TEST_FILE in tests/integration/conftest.py")
    assert "all_tis" in code.co_varnames, (
        f"DAG.test has no local all_tis any more (locals: {code.co_varnames}): update "
        "dag_test_polls_on_progress in tests/integration/conftest.py")
    assert "sleep" in code.co_names, "DAG.test no longer calls time.sleep: dag_test_polls_on_progress can go"
