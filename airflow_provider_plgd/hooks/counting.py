"""Deprecated path: moved to :mod:`airflow_provider_plgd.jetstream.counting` (kept for users' imports; warns)."""

import sys

from airflow_provider_plgd._moved import moved_module
from airflow_provider_plgd.jetstream.counting import *  # noqa: F403 - for type checkers; the module below replaces this one

sys.modules[__name__] = moved_module(__name__, "airflow_provider_plgd.jetstream.counting")
