"""On-demand access to the repository's development tools (``plgd_devtools``), which the wheel does not ship.

The simulator's ground truth (``plgd_devtools.ground_truth``) and its corrupt-payload injector
(``plgd_devtools.faults``) live there. ``plgd-simulate --ground-truth`` and ``--faults corrupt``
(``SimulationConfig(corrupt=N)``) load them by name when asked for, so the simulator of an installed
provider works without them.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["load_devtools"]


def load_devtools(module: str, feature: str) -> ModuleType:
    """Import ``plgd_devtools.<module>``.

    :param module: ``ground_truth`` or ``faults``.
    :param feature: what needs it, for the error message (e.g. ``"--ground-truth"``).
    :raises ModuleNotFoundError: ``plgd_devtools`` is not importable (an installed provider, no
        source checkout); the message names the feature and where the module comes from.
    """
    name = f"plgd_devtools.{module}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name not in ("plgd_devtools", name):
            raise
        raise ModuleNotFoundError(
            f"{feature} needs {name}, one of the development tools of the airflow-provider-plgd repository, "
            "which the installed provider does not include: run it from a source checkout of the repository "
            "(or put the checkout's folder on PYTHONPATH)",
            name=name,
        ) from None
