"""The simulator configurations of the simulator's unit tests (the module fixtures ``faulty`` and
``clean`` of conftest.py are generated from them).
"""

from __future__ import annotations

from airflow_provider_plgd.simulator import SimulationConfig

ALL_FAULTS = dict(duplicates=0.05, corrupt=4, old_hub_snapshots=True, version_gaps=True, unregister=True)
NO_FAULTS = dict(duplicates=0.0, corrupt=0, old_hub_snapshots=False, version_gaps=False, unregister=False)
BASE = SimulationConfig(seed=3, owners=2, devices_per_owner=3, resources_per_device=3, intervals=3,
                        steps_per_interval=40)


def originals(sim):
    return [m for m in sim.messages if m.fault not in ("duplicate", "corrupt")]
