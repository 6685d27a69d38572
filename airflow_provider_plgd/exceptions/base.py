"""The root of every exception of the provider (:class:`PlgdError`); import the classes from
:mod:`airflow_provider_plgd.exceptions`."""

from __future__ import annotations


class PlgdError(Exception):
    """Root of every exception of the provider: ``except PlgdError`` catches them all (the
    Airflow-bound errors of :mod:`~airflow_provider_plgd.exceptions.airflow_tasks` too)."""
