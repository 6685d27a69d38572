"""A StatsD listener on loopback for the metrics tests (``tests/integration/test_metrics_monitor.py``,
``tests/airflow2/test_airflow2_metrics.py``): what Airflow's ``Stats`` sends, parsed. Not in the wheel."""

from __future__ import annotations

import socket
import threading


class StatsdListener:
    """UDP datagrams to 127.0.0.1:<port>, parsed as StatsD lines ``name[,tag=value...]:value|type``."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65535)
            except TimeoutError:
                continue
            self.lines += data.decode().splitlines()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()

    def metrics(self, prefix: str = "airflow.plgd.") -> dict[str, tuple[float, str, dict[str, str]]]:
        """``{name: (value, type, tags)}`` of the lines under ``prefix`` (the last one of each name)."""
        found = {}
        for line in self.lines:
            head, _, rest = line.partition(":")
            value, _, kind = rest.partition("|")
            name, *tags = head.split(",")
            if name.startswith(prefix):
                found[name[len("airflow."):]] = (float(value), kind, dict(t.split("=", 1) for t in tags))
        return found
