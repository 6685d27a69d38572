"""Test TLS material for a ``nats-server``: a self-signed CA, a server and a client certificate.

Generated at test time with the ``cryptography`` package (never checked in):
:func:`write_tls_files` writes the PEM files, :func:`tls_block` renders the server's ``tls {}``
configuration block. Also importable from :mod:`plgd_devtools.nats_server`.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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
    # lazy: cryptography loads only for the TLS tests
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
