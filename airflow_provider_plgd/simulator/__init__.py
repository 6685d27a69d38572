"""Deterministic plgd hub traffic simulator with ground truth (console script ``plgd-simulate``).

* :func:`generate` (``SimulationConfig`` -> ``Simulation``): messages in the exact wire format
  (docs/wire-format.md §1-§3) with the configured faults.
* :func:`expected_state`: the snapshot tables after an interval (docs/wire-format.md §4, §4.9;
  columns in ``docs/data-contracts.md`` "Snapshot tables").
* :func:`publish`: publish to a JetStream stream, optionally inside the intervals' wall-clock
  windows; returns the :class:`GroundTruth` (``.write(dir)``: messages.parquet, state_<k>.json,
  summary.json).
"""

from .config import SimulationConfig
from .generator import Simulation, generate
from .ground_truth import GroundTruth
from .messages import SimMessage
from .publisher import PublishError, acreate_stream, apublish, create_stream, publish
from .state import expected_state
from ..plgd.tables import SNAPSHOT_SCHEMAS, SNAPSHOT_TABLES

__all__ = [
    "GroundTruth",
    "PublishError",
    "SNAPSHOT_SCHEMAS",
    "SNAPSHOT_TABLES",
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
