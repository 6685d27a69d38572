"""The fetch pipeline: JetStream batches into committed staging folders, with their accounting.

The operator (:mod:`airflow_provider_plgd.operators.jetstream_to_staging`) keeps the Airflow side
(arguments, templated fields, ``execute``, XCom); the ETL DAG's ``plan`` builds the same
:class:`~airflow_provider_plgd.fetch.selection.Selection`. One concept per module:

- :mod:`.selection`: what a fetch reads (owners, event types), validated once, and its targets;
- :mod:`.pipeline`: the batch pipeline (bounded, owner-wide and durable reads, the writer thread,
  progress, the accounting staged + skipped == expected);
- :mod:`.router`: routing the messages of one owner-wide consumer to their batches;
- :mod:`.spool`: the durable mode's local spool files;
- :mod:`.retention`: the rule that refuses a batch whose messages the stream no longer holds.

No Airflow import: the pipeline takes a logger and its settings as arguments.
"""
