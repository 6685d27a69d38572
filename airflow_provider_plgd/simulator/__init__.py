"""Deterministic plgd hub traffic simulator (console script ``plgd-simulate``).

* :func:`generate` (``SimulationConfig`` -> ``Simulation``): messages in the exact wire format
  (docs/wire-format.md §1-§3) with the configured faults.
* :func:`expected_state`: the snapshot tables after an interval (docs/wire-format.md §4, §4.9;
  columns in ``docs/data-contracts.md`` "Snapshot tables").
* :func:`publish`: publish to a JetStream stream, optionally inside the intervals' wall-clock
  windows; returns the :class:`PublishResult` (stream sequences, windows).

The ground truth of a run (``messages.parquet``, ``state_<k>.json``, ``summary.json``:
``plgd_devtools.ground_truth.GroundTruth``) and the corrupt-payload injector
(``plgd_devtools.faults``) are development tools of the repository, not part of the wheel;
``plgd-simulate --ground-truth`` and ``--faults corrupt`` load them on demand (:mod:`.devtools`).
"""

from ..plgd.tables import SNAPSHOT_SCHEMAS, SNAPSHOT_TABLES
from .config import SimulationConfig
from .generator import Simulation, generate
from .messages import SimMessage
from .publisher import PublishError, PublishResult, acreate_stream, apublish, create_stream, publish
from .state import expected_state

__all__ = [
    "SNAPSHOT_SCHEMAS",
    "SNAPSHOT_TABLES",
    "PublishError",
    "PublishResult",
    "SimMessage",
    "Simulation",
    "SimulationConfig",
    "acreate_stream",
    "apublish",
    "create_stream",
    "expected_state",
    "generate",
    "publish",
]
