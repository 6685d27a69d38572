"""The JetStream client library of the provider: no Airflow import (the Spark executors use it).

* :mod:`.connection`: the ``plgd_jetstream`` connection type, its fields and the settings
  (:class:`~.connection.JetStreamSettings`) with their checks;
* :mod:`.client`: opening a nats-py client on the settings (credentials, TLS, the clear-text guard);
* :mod:`.api`: the one JetStream API client (requests, error mapping, consumers, pulls, publish);
* :mod:`.messages`: :class:`~.messages.StreamMessage` and the ack-reply metadata;
* :mod:`.counting`: counting a stream's messages per range, a range's bounds and its split;
* :mod:`.pull`: the pull engine (the read loop of one consumer);
* :mod:`.durable`: the durable consumer (explicit acks);
* :mod:`.completeness`: whether the stream holds all of an interval (server clock only);
* :mod:`.blocking`: the sync twin of an async method.

The Airflow hooks (:mod:`airflow_provider_plgd.hooks`) are thin faces over these modules, as in
the Kafka provider.
"""
