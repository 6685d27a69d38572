"""An OTLP/HTTP metrics receiver on loopback for the metrics tests (``tests/integration/test_metrics_monitor.py``):
what Airflow's OpenTelemetry metrics (``[metrics] otel_on``) export, decoded with ``opentelemetry-proto``.
Not in the wheel."""

from __future__ import annotations

import gzip
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest


def _value(attr: Any) -> Any:
    kind = attr.value.WhichOneof("value")
    return getattr(attr.value, kind) if kind else None


class OtlpListener:
    """``POST http://127.0.0.1:<port>/v1/metrics`` (protobuf, as the SDK's OTLP/HTTP exporter sends it),
    kept as decoded requests; :meth:`metrics` flattens them."""

    def __init__(self) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        self.paths: list[str] = []
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                encoding = self.headers.get("Content-Encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                request = ExportMetricsServiceRequest()
                request.ParseFromString(body)
                listener.paths.append(self.path)
                listener.requests.append(request)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)

    def metrics(self, prefix: str = "airflow.plgd.") -> dict[str, tuple[float, str, dict[str, Any]]]:
        """``{name: (value, kind, attributes)}`` of the data points under ``prefix``, the last export of
        each name (``kind``: ``sum`` for a counter, ``gauge``; a name with several attribute sets:
        the last point)."""
        found = {}
        for request in self.requests:
            for resource in request.resource_metrics:
                for scope in resource.scope_metrics:
                    for metric in scope.metrics:
                        if not metric.name.startswith(prefix):
                            continue
                        kind = metric.WhichOneof("data")
                        for point in getattr(metric, kind).data_points:
                            number = point.as_int if point.WhichOneof("value") == "as_int" else point.as_double
                            found[metric.name[len("airflow."):]] = (
                                float(number), kind, {a.key: _value(a) for a in point.attributes})
        return found
