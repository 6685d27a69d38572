"""Sample the resident memory of a process tree (an ``airflow dags test`` run and its children).

A background thread reads, every ``period`` seconds, the RSS (bytes, ``psutil`` ``memory_info().rss``)
of the root process and all its descendants and classifies each process:

* ``jvm``: a ``java`` process (the spark-submit driver JVM in local mode);
* ``spark_py``: Python processes started by Spark (the application's driver Python,
  ``pyspark.daemon`` and its forked workers);
* ``airflow``: everything else (the ``airflow dags test`` process, fetch/plan/summary code runs in it).

RSS of forked workers shares pages with their daemon, so the sums overstate the memory really
used (an upper bound). It also records every ``spark-submit`` process (the operator's child:
the ``spark-submit`` script that becomes the ``SparkSubmit`` JVM), or on Spark Connect every
client process (``python spark_apps/<app>.py``): its start (``create_time``,
unix seconds) and the last sample it was alive at (so its wall time is exact at the start and
within one period at the end).
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field

import psutil


@dataclass
class Sample:
    """One reading: ``t`` unix seconds; RSS in bytes: ``total`` and per class (``jvm``, ``spark_py``, ``airflow``)."""

    t: float
    total: int
    jvm: int
    spark_py: int
    airflow: int


@dataclass
class SubmitProcess:
    """A spark-submit process: ``pid``, ``start`` (create_time, unix s), ``last_seen`` (unix s),
    ``app`` (script name), ``ppid`` (parent pid: ``spark-class`` forks bash subshells with the same
    command line; :meth:`TreeSampler.top_submits` keeps the outermost)."""

    pid: int
    start: float
    last_seen: float
    app: str
    ppid: int = 0


@dataclass
class TreeSampler:
    """Samples the tree of ``root_pid`` every ``period`` seconds until :meth:`stop` (use as a context manager).

    Attributes after sampling: ``samples`` (list of :class:`Sample`), ``submits`` (pid ->
    :class:`SubmitProcess`), ``extra`` (name -> peak RSS bytes of the extra pids given, e.g. the
    nats-server). A process that ends between listing and reading counts as 0 in that sample.
    """

    root_pid: int
    period: float = 0.2
    extra_pids: dict[str, int] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    submits: dict[int, SubmitProcess] = field(default_factory=dict)
    extra: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self._kinds: dict[tuple[int, float], str] = {}

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop the thread and wait for it."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _kind(self, proc: psutil.Process) -> str:
        key = (proc.pid, proc.create_time())
        kind = self._kinds.get(key)
        if kind is None:
            name = proc.name()
            cmd = " ".join(proc.cmdline())
            launcher = "org.apache.spark.launcher.Main" in cmd  # spark-class's short-lived command builder
            # a spark-submit, or a Spark Connect client (python spark_apps/<app>.py with SPARK_REMOTE);
            # the Python driver a spark-submit starts runs the same script: top_submits drops it
            client = "spark_apps/" in cmd and name.startswith("python")
            if not launcher and (client or "spark-submit" in cmd or "org.apache.spark.deploy.SparkSubmit" in cmd):
                app = next((part.rsplit("/", 1)[-1] for part in proc.cmdline() if part.endswith(".py")), "?")
                self.submits.setdefault(proc.pid, SubmitProcess(proc.pid, proc.create_time(), time.time(), app,
                                                                proc.ppid()))
            if name == "java" or name.startswith("java"):
                kind = "jvm"
            elif "pyspark" in cmd or "spark_apps" in cmd:
                kind = "spark_py"
            elif "spark-submit" in cmd or "spark-class" in cmd:
                kind = "jvm"  # the launcher script before it execs java
            else:
                kind = "airflow"
            self._kinds[key] = kind
        return kind

    def _loop(self) -> None:
        try:
            root = psutil.Process(self.root_pid)
        except psutil.NoSuchProcess:
            return
        extras = {}
        for name, pid in self.extra_pids.items():
            with contextlib.suppress(psutil.NoSuchProcess):
                extras[name] = psutil.Process(pid)
        while not self._stop.is_set():
            now = time.time()
            sums = {"jvm": 0, "spark_py": 0, "airflow": 0}
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            for proc in procs:
                try:
                    kind = self._kind(proc)
                    # a launcher script execs java under the same pid: reclassify by its current name
                    if kind != "jvm" and proc.name() == "java":
                        kind = "jvm"
                    sums[kind] += proc.memory_info().rss
                    if proc.pid in self.submits:
                        self.submits[proc.pid].last_seen = now
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
            self.samples.append(Sample(now, sum(sums.values()), sums["jvm"], sums["spark_py"], sums["airflow"]))
            for name, proc in extras.items():
                with contextlib.suppress(psutil.NoSuchProcess):
                    self.extra[name] = max(self.extra.get(name, 0), proc.memory_info().rss)
            self._stop.wait(self.period)

    def top_submits(self) -> list[SubmitProcess]:
        """The spark-submit processes started by the task itself (parent not another spark-submit process)."""
        return [p for p in self.submits.values() if p.ppid not in self.submits]

    def peak(self, start: float, end: float) -> dict[str, int]:
        """Peak RSS (bytes) in the window ``[start, end]`` (unix s): ``total`` and per class (each its own maximum).

        Returns zeros when no sample falls in the window.
        """
        inside = [s for s in self.samples if start <= s.t <= end]
        return {k: max((getattr(s, k) for s in inside), default=0) for k in ("total", "jvm", "spark_py", "airflow")}
