"""The library of the three Spark applications (decode, dedupe, snapshot rebuild), and the Spark
data source ``plgd-jetstream`` for any Spark job (:mod:`.datasource`).

The application scripts (``airflow_provider_plgd/spark_apps/*.py``) parse their arguments and call
into this package; ``--py-files`` ships the whole ``airflow_provider_plgd`` package
(:mod:`airflow_provider_plgd.spark_deps`). Nothing here imports Airflow.
"""
