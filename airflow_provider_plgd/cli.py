"""``plgd-etl``: command-line tools for the tables of a pipeline (console script, ``setup.cfg``).

``plgd-etl status --root ROOT [--stream EVENTS] [--json] [--conn-id ID | --servers URL[,URL]]
[--creds-file PATH] [--recent N] [--overdue-seconds S]`` prints the status view (:mod:`airflow_provider_plgd.status`):
the chain (head, committed intervals, holes, unfinished and failed intervals, stretches never
planned), each table's Delta version, files and rows, and, with a connection or servers, the lag
behind the stream in messages and seconds. It reads only the tables, the ledger and the server.

Credentials never go on the command line: ``--conn-id`` names an Airflow connection of type
``plgd_jetstream`` (e.g. from ``AIRFLOW_CONN_<ID>`` in the environment); ``--servers`` takes
server URLs without credentials, with ``--creds-file`` (a path) when the server needs them.
Exit status: 0; 1 when the chain has problems (``ChainStatus.problems``: holes, failed or stale
intervals, or unfinished or not-done ones older than the newest planned interval); 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from types import SimpleNamespace
from typing import Any


def build_parser() -> argparse.ArgumentParser:
    """The ``plgd-etl`` argument parser."""
    parser = argparse.ArgumentParser(prog="plgd-etl", description="Tools for the tables of a plgd pipeline.")
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="the chain, the tables and the lag behind the stream",
                            description="The chain (head, committed intervals, holes, failed intervals), each "
                                        "table's Delta version, files and rows, and the lag behind the stream.")
    status.add_argument("--root", required=True, help="the storage root (path or URL, e.g. s3://bucket/plgd)")
    status.add_argument("--stream", default="EVENTS", help="the stream (the ledger's folder; default EVENTS)")
    status.add_argument("--json", action="store_true", help="print JSON (every list whole)")
    server = status.add_mutually_exclusive_group()
    server.add_argument("--conn-id", help="an Airflow connection of type plgd_jetstream: the lag from its server")
    server.add_argument("--servers", help="NATS server URLs, comma-separated, without credentials: the lag")
    status.add_argument("--creds-file", help="a NATS .creds file for --servers")
    status.add_argument("--recent", type=int, default=None,
                        help="how many of the newest intervals' summaries are read for failed intervals (default 48)")
    status.add_argument("--overdue-seconds", type=float, default=None,
                        help="the newest planned interval counts as a problem when its plan is older than this "
                             "(default: the interval's length; before that it may still be running)")
    return parser


def _hook(args: argparse.Namespace) -> Any:
    """A ``JetStreamHook`` for ``--conn-id`` or ``--servers``, or None."""
    if not (args.conn_id or args.servers):
        return None
    # lazy: Airflow loads only for a subcommand that talks to a server (--help stays fast)
    from airflow_provider_plgd.hooks.jetstream import JetStreamHook
    from airflow_provider_plgd.jetstream.connection import settings_from_connection

    if args.conn_id:
        return JetStreamHook(args.conn_id, stream=args.stream)
    conn = SimpleNamespace(conn_id="--servers", host=None, port=None, login=None, password=None,
                           extra_dejson={"servers": args.servers, "stream": args.stream,
                                         **({"creds_file": args.creds_file} if args.creds_file else {})})
    return JetStreamHook.from_settings(settings_from_connection(conn, args.stream))


def status_main(args: argparse.Namespace) -> int:
    """``plgd-etl status``: print the view; 1 when it has problems (``ChainStatus.problems``)."""
    # lazy: the table readers (pyarrow, deltalake) load only for this subcommand
    from airflow_provider_plgd.status import DEFAULT_RECENT, chain_status, format_status, with_stream_lag

    if args.creds_file and not args.servers:
        raise ValueError("--creds-file goes with --servers (a connection has its own credentials)")
    recent = DEFAULT_RECENT if args.recent is None else args.recent
    if recent < 0:
        raise ValueError(f"--recent must be >= 0, got {recent}")
    out = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):  # what libraries print (Airflow's config, logs): not the view
        if args.overdue_seconds is not None and args.overdue_seconds < 0:
            raise ValueError(f"--overdue-seconds must be >= 0, got {args.overdue_seconds}")
        view = chain_status(args.root, args.stream, recent=recent, overdue_seconds=args.overdue_seconds)
        hook = _hook(args)
        if hook is not None:
            view = with_stream_lag(view, hook)
    print(json.dumps(view.as_dict(), indent=1) if args.json else format_status(view), file=out)
    return 1 if view.problems() else 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``plgd-etl``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return status_main(args)
    except ValueError as exc:
        print(f"plgd-etl {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover - python -m airflow_provider_plgd.cli
    sys.exit(main())
