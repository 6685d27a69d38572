"""Apache Airflow provider for plgd hub events on NATS JetStream.

The provider registers itself through the ``apache_airflow_provider`` entry point
(:func:`airflow_provider_plgd.get_provider_info.get_provider_info`).
"""

from __future__ import annotations

__version__ = "0.1.0"
DISTRIBUTION_NAME = "airflow-provider-plgd"

__all__ = ["__version__", "DISTRIBUTION_NAME"]
