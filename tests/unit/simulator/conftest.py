"""Fixtures of the simulator's unit tests: one simulation with every fault and one without (each
module generates its own, in a few hundredths of a second)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from airflow_provider_plgd.simulator import generate
from tests.unit.simulator.sim_configs import ALL_FAULTS, BASE, NO_FAULTS


@pytest.fixture(scope="module")
def faulty():
    return generate(replace(BASE, **ALL_FAULTS))


@pytest.fixture(scope="module")
def clean():
    return generate(replace(BASE, **NO_FAULTS))
