"""Python tasks on the executors, on any Spark: classic (``spark-submit``) or Spark Connect.

The three applications run their work as plain Python functions over small, picklable task
descriptors (file lists) and collect small records (file records, counts) on the driver; the data
files are written by the tasks. This module is the one place that turns that into Spark jobs:

* :func:`run_tasks` -- ``tasks`` -> ``fn`` per task (one partition each) -> the records, in task order;
* :func:`run_stages` -- the same followed by shuffles: the ``(key, value)`` pairs a step yields go
  to partition ``shuffle.partition_of(key) % shuffle.partitions`` of the next step (like
  ``RDD.partitionBy``), with optional ``extra`` pairs added to that step's input;
* :func:`default_parallelism` -- the task slots to plan for.

A step's function gets the iterator of its partition's elements (the RDD ``mapPartitions``
contract; every partition ``0..n-1`` of a shuffle step is called, also an empty one) and may read
its partition index with ``pyspark.TaskContext.get().partitionId()``.

Two implementations, the same results:

* ``dataframe`` (the DataFrame API only, so it also runs on Spark Connect, which has no RDDs):
  the first step is ``spark.range(0, n, 1, n).mapInArrow`` (partition ``i`` holds the single row
  ``i``; the task descriptors travel with the function), each element a row ``(p, src, seq, v)``
  (target partition, producing partition, position, pickled value); a shuffle is
  ``DataFrame.repartitionById(n, "p")`` (Spark >= 4.1: the row goes to partition ``p``) followed by
  ``mapInArrow``; one marker row per target partition makes every partition run (also the
  empty ones). A step's input is sorted by ``(src, seq)``, so its order does not depend on the
  order in which the shuffle delivers blocks; the collected records are in ``(partition, seq)`` order.
* ``rdd`` (classic only): ``sparkContext.parallelize(tasks, n).mapPartitions(fn)``,
  ``partitionBy(n, partition_of)``, ``union`` and ``collect``, as before Spark Connect support.

:func:`executor_api` chooses: ``spark.plgd.executorApi`` (``rdd`` or ``dataframe``) when the
session sets it, else ``dataframe`` on Spark Connect and ``rdd`` on classic Spark (fewer moving
parts per task: no Arrow stream between JVM and Python; figures: docs/performance.md, M11).
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

#: Spark setting that picks the implementation (``rdd`` or ``dataframe``; unset: :func:`executor_api`).
EXECUTOR_API_CONF = "spark.plgd.executorApi"
#: Spark setting: the task slots :func:`default_parallelism` returns when set (a positive integer).
PARALLELISM_CONF = "spark.plgd.defaultParallelism"
EXECUTOR_APIS = ("rdd", "dataframe")

#: The rows of the ``dataframe`` implementation: target partition, producing partition (-1: the
#: driver's ``extra`` pairs and the markers), position in the producer's output, pickled value (null: marker).
ROW_SCHEMA = "p int, src int, seq long, v binary"
#: Rows per Arrow batch a step yields and gets (values are small records or Arrow IPC streams of a few MB).
_BATCH_ROWS = 64
#: The Spark setting of the rows per Arrow batch into ``mapInArrow``, set to :data:`_BATCH_ROWS`
#: for the job (restored after).
ARROW_BATCH_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"

StepFn = Callable[[Iterator[Any]], Iterable[Any]]


@dataclass(frozen=True)
class Shuffle:
    """One shuffle and the step after it.

    :param partitions: partitions of the step (>= 1).
    :param fn: the step's function: an iterator of ``(key, value)`` pairs -> its output elements.
    :param partition_of: ``key`` -> partition (taken modulo ``partitions``), like ``RDD.partitionBy``;
        default: the key itself (an int).
    :param extra: ``(key, value)`` pairs added to the step's input by the driver (picklable).
    """

    partitions: int
    fn: StepFn
    partition_of: Callable[[Any], int] | None = None
    extra: Sequence[tuple[Any, Any]] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if int(self.partitions) < 1:
            raise ValueError(f"a shuffle needs at least 1 partition, got {self.partitions!r}")

    def target(self, key: Any) -> int:
        """The partition of a pair with ``key``: ``partition_of(key) % partitions``."""
        return int(key if self.partition_of is None else self.partition_of(key)) % int(self.partitions)


def is_connect(spark: Any) -> bool:
    """True when ``spark`` is a Spark Connect session (``pyspark.sql.connect``)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _conf(spark: Any, key: str) -> str | None:
    try:
        value = spark.conf.get(key, None)
    except Exception:  # a server that refuses the key: treat as unset
        return None
    return None if value in (None, "") else str(value)


def executor_api(spark: Any) -> str:
    """``rdd`` or ``dataframe``: the session's :data:`EXECUTOR_API_CONF`, else ``dataframe`` on
    Spark Connect and ``rdd`` on classic Spark.

    :raises ValueError: the setting is another value, or ``rdd`` on Spark Connect.
    """
    chosen = _conf(spark, EXECUTOR_API_CONF)
    if chosen is None:
        return "dataframe" if is_connect(spark) else "rdd"
    chosen = chosen.strip().lower()
    if chosen not in EXECUTOR_APIS:
        raise ValueError(f"{EXECUTOR_API_CONF} must be one of {EXECUTOR_APIS}, got {chosen!r}")
    if chosen == "rdd" and is_connect(spark):
        raise ValueError(f"{EXECUTOR_API_CONF}=rdd: Spark Connect has no RDD API; use dataframe")
    return chosen


def default_parallelism(spark: Any) -> int:
    """The task slots to plan for (>= 1).

    :data:`PARALLELISM_CONF` when set, else ``spark.default.parallelism`` when set, else on classic
    Spark ``sparkContext.defaultParallelism``, and on Spark Connect the partitions of
    ``spark.range(n)`` (the server's default, its executors' cores; one small job, no shuffle,
    run once per session: its answer is kept in the session's :data:`PARALLELISM_CONF`).

    :raises ValueError: a setting that is not a positive integer.
    """
    for key in (PARALLELISM_CONF, "spark.default.parallelism"):
        value = _conf(spark, key)
        if value is not None:
            try:
                slots = int(value)
            except ValueError:
                slots = 0
            if slots < 1:
                raise ValueError(f"{key} must be a positive integer, got {value!r}")
            return slots
    if not is_connect(spark):
        return max(1, int(spark.sparkContext.defaultParallelism))
    # lazy: pyspark only with a session (this module imports without it)
    from pyspark.sql import functions as F

    # the leaf parallelism the server gives spark.range without numPartitions
    row = spark.range(0, 1 << 16).select(F.spark_partition_id().alias("p")).groupBy().agg(
        F.max("p").alias("p")).first()
    slots = max(1, int(row["p"]) + 1) if row is not None and row["p"] is not None else 1
    # the next caller of this session (rebuild asks twice) reads it instead of a second job;
    # a server that refuses the key: measure again next time
    with contextlib.suppress(Exception):
        spark.conf.set(PARALLELISM_CONF, str(slots))
    return slots


def run_tasks(spark: Any, tasks: Sequence[Any], fn: StepFn) -> list[Any]:
    """Run ``fn`` once per task (partition ``i`` gets the iterator of ``[tasks[i]]``) and return
    every element the calls yield, task by task in order (like
    ``sparkContext.parallelize(tasks, len(tasks)).mapPartitions(fn).collect()``).

    :param tasks: picklable task descriptors; none: no job, ``[]``.
    :param fn: the task function (pickled with cloudpickle; its results must be picklable).
    """
    return run_stages(spark, tasks, fn)


def run_stages(spark: Any, tasks: Sequence[Any], fn: StepFn, *shuffles: Shuffle) -> list[Any]:
    """Run ``fn`` once per task, then each shuffle and its step; return the last step's elements
    (partition by partition; within one, in the order its function yields them).

    The elements of every step but the last must be ``(key, value)`` pairs. With no tasks the
    first step yields nothing, and the shuffles still run (their ``extra`` pairs, empty partitions).
    """
    if not tasks and not shuffles:
        return []
    if executor_api(spark) == "rdd":
        return _rdd_stages(spark, list(tasks), fn, shuffles)
    return _dataframe_stages(spark, list(tasks), fn, shuffles)


# -- rdd -----------------------------------------------------------------------------------------
def _rdd_stages(spark: Any, tasks: list[Any], fn: StepFn, shuffles: Sequence[Shuffle]) -> list[Any]:
    sc = spark.sparkContext
    rdd = sc.parallelize(tasks, len(tasks)).mapPartitions(fn) if tasks else sc.parallelize([], 1)
    for shuffle in shuffles:
        if shuffle.extra:
            rdd = rdd.union(sc.parallelize(list(shuffle.extra), max(1, min(len(shuffle.extra), shuffle.partitions))))
        partition_of = shuffle.partition_of or _identity
        rdd = rdd.partitionBy(shuffle.partitions, partition_of).mapPartitions(shuffle.fn)
    return rdd.collect()


def _identity(key: Any) -> Any:
    return key


# -- dataframe -----------------------------------------------------------------------------------
def _dataframe_stages(spark: Any, tasks: list[Any], fn: StepFn, shuffles: Sequence[Shuffle]) -> list[Any]:
    # lazy: pyspark only with a session (this module imports without it)
    from pyspark.sql import functions as F

    nxt = shuffles[0] if shuffles else None
    n = max(1, len(tasks))
    df = spark.range(0, n, 1, n).mapInArrow(_first_step(tasks, fn, nxt), ROW_SCHEMA)
    for i, shuffle in enumerate(shuffles):
        nxt = shuffles[i + 1] if i + 1 < len(shuffles) else None
        markers = spark.range(0, shuffle.partitions, 1, 1).select(
            F.col("id").cast("int").alias("p"), F.lit(-1).alias("src"), F.lit(-1).cast("long").alias("seq"),
            F.lit(None).cast("binary").alias("v"))
        df = df.unionByName(markers)
        if shuffle.extra:
            rows = [(shuffle.target(k), -1, j, pickle.dumps((k, v), protocol=pickle.HIGHEST_PROTOCOL))
                    for j, (k, v) in enumerate(shuffle.extra)]
            df = df.unionByName(spark.createDataFrame(rows, ROW_SCHEMA))
        df = df.repartitionById(shuffle.partitions, "p").mapInArrow(_shuffle_step(shuffle.fn, nxt), ROW_SCHEMA)
    # at most _BATCH_ROWS values per Arrow batch into a step too: a binary column holds < 2 GiB per batch
    previous = _conf(spark, ARROW_BATCH_CONF)
    spark.conf.set(ARROW_BATCH_CONF, str(_BATCH_ROWS))
    try:
        table = df.toArrow()
    finally:
        if previous is None:
            spark.conf.unset(ARROW_BATCH_CONF)
        else:
            spark.conf.set(ARROW_BATCH_CONF, previous)
    order = sorted(zip(table.column("p").to_pylist(), table.column("seq").to_pylist(), range(table.num_rows),
                       strict=True))
    values = table.column("v").to_pylist()
    return [pickle.loads(values[j]) for _, _, j in order]


def _emit(me: int, elements: Iterable[Any], nxt: Shuffle | None) -> Iterator[Any]:
    """Arrow batches of :data:`ROW_SCHEMA` rows of ``elements`` produced by partition ``me``."""
    schema = pa.schema([("p", pa.int32()), ("src", pa.int32()), ("seq", pa.int64()), ("v", pa.binary())])
    cols: tuple[list[Any], list[Any], list[Any], list[Any]] = ([], [], [], [])
    for seq, element in enumerate(elements):
        cols[0].append(me if nxt is None else nxt.target(element[0]))
        cols[1].append(me)
        cols[2].append(seq)
        cols[3].append(pickle.dumps(element, protocol=pickle.HIGHEST_PROTOCOL))
        if len(cols[0]) >= _BATCH_ROWS:
            yield pa.RecordBatch.from_arrays([pa.array(c, t) for c, t in zip(cols, schema.types, strict=True)],
                                             schema=schema)
            cols = ([], [], [], [])
    if cols[0]:
        yield pa.RecordBatch.from_arrays([pa.array(c, t) for c, t in zip(cols, schema.types, strict=True)],
                                         schema=schema)


def _partition_id() -> int:
    # lazy: pyspark only in the Spark task (this module imports without it)
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.partitionId() if ctx is not None else 0


def _first_step(tasks: list[Any], fn: StepFn, nxt: Shuffle | None):
    """``mapInArrow`` function of the first step: the ``id`` rows of ``spark.range`` -> ``fn``'s
    elements as :data:`ROW_SCHEMA` rows."""

    def step(batches: Iterator[Any]) -> Iterator[Any]:
        ids = [i for batch in batches for i in batch.column(0).to_pylist()]
        me = _partition_id()
        if ids != [me] and tasks:
            raise RuntimeError(f"executor_tasks: partition {me} got task ids {ids}, expected [{me}]")
        yield from _emit(me, fn(iter([tasks[me]])) if tasks else iter(()), nxt)

    return step


def _shuffle_step(fn: StepFn, nxt: Shuffle | None):
    """``mapInArrow`` function of a step after ``repartitionById``: the partition's rows, sorted by
    ``(src, seq)``, markers left out -> ``fn``'s elements as :data:`ROW_SCHEMA` rows."""

    def step(batches: Iterator[Any]) -> Iterator[Any]:
        me = _partition_id()
        rows = []
        for batch in batches:
            for p, src, seq, v in zip(*(batch.column(c).to_pylist() for c in ("p", "src", "seq", "v")), strict=True):
                if p != me:
                    raise RuntimeError(f"executor_tasks: partition {me} got a row of partition {p}")
                if v is not None:
                    rows.append((src, seq, v))
        rows.sort(key=lambda r: (r[0], r[1]))
        elements = (pickle.loads(v) for _, _, v in rows)
        yield from _emit(me, fn(elements), nxt)

    return step
