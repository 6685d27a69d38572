"""The fetch pipeline: JetStream batches into the staging Delta table, with their accounting.

The operator (:mod:`airflow_provider_plgd.operators.jetstream_to_staging`) keeps the Airflow side
(arguments, templated fields, ``execute``, XCom); the ETL DAG's ``plan`` builds the same
:class:`~airflow_provider_plgd.fetch.selection.Selection`. One concept per module:

- :mod:`.selection`: what a fetch reads (owners, event types), validated once, and its targets;
- :mod:`.pipeline`: the batch pipeline (range, bounded, owner-wide and durable reads, the writer
  thread, progress, the accounting staged + skipped == expected, the commits);
- :mod:`.router`: routing the messages of one consumer to their (owner, event type) batches;
- :mod:`.stager`: a task's staging files: per event type, rows sorted by owner, cut by size,
  spilling sorted runs past its memory budget;
- :mod:`.spool`: the local spill folder and the clean-up of killed runs' files;
- :mod:`.retention`: the rule that refuses a batch whose messages the stream no longer holds.

No Airflow import: the pipeline takes a logger and its settings as arguments.
"""
