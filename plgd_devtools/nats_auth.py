"""NKEYs, NATS JWTs and ``.creds`` files for a ``nats-server`` in operator mode (decentralized JWT auth).

:func:`new_nkey` makes an NKEY pair; :class:`OperatorMode` holds operator, account and user JWTs
for a ``MEMORY`` resolver and writes ``.creds`` files. Source: NATS docs "Securing NATS >
Authentication > NKEYs / Decentralized JWT Authentication/Authorization" and the JWT v2 format of
``github.com/nats-io/jwt/v2`` (header ``{"typ":"JWT","alg":"ed25519-nkey"}``, claims
``jti``/``iat``/``iss``/``name``/``sub``/``nats``, ed25519 signature by the issuer's NKEY, base64url
without padding). Generated at test time, never checked in. Also importable from
:mod:`plgd_devtools.nats_server`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

_NKEY_PREFIX = {"operator": 14 << 3, "account": 0, "user": 20 << 3}


def new_nkey(kind: str = "user") -> tuple[str, str]:
    """A new random NKEY pair: ``(seed, public_key)`` as str (seed ``SO…``/``SA…``/``SU…``,
    public key ``O…``/``A…``/``U…``).

    :param kind: ``"operator"``, ``"account"`` or ``"user"``.
    :raises ValueError: another kind.
    """
    # lazy: keep this module importable without nats-py
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
    # lazy: keep this module importable without nats-py
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
