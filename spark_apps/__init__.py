"""PySpark applications of airflow-provider-plgd (decode, dedupe, rebuild).

Each application is a script with ``main(argv=None)``; they are submitted with ``spark-submit``
and ``--py-files`` built by :mod:`airflow_provider_plgd.spark_deps`. ``schemas`` holds the table
schemas, ``common`` the helpers the applications share.
"""
