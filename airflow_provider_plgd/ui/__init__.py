"""The plgd page of the Airflow 3 UI: the chain of each ETL DAG, its tables and its lag.

:mod:`.timeline` (the chain as states per interval, paged and summarised; no Airflow),
:mod:`.pipelines` (the ETL DAGs of the metadata database, the status cache, DAG runs per interval),
:mod:`.api` (the FastAPI app: JSON API and the page), :mod:`.plugin` (the ``AirflowPlugin`` the
provider registers). docs/ui.md.
"""
