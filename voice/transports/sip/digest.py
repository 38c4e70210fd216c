"""Digest authentication of INVITEs (RFC 3261 section 22, RFC 2617 MD5 with qop=auth).

Nonces are stateless: a timestamp signed with a per-process secret, so no table of issued
nonces grows with traffic and an expired one is answered with ``stale=true``.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from .message import split_list

NONCE_TTL_S = 300.0


def _md5(text: str) -> str:
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()


def parse_credentials(value: str) -> dict[str, str]:
    scheme, _, rest = value.strip().partition(" ")
    if scheme.lower() != "digest":
        raise ValueError(f"unsupported authorization scheme {scheme[:20]!r}")
    out: dict[str, str] = {}
    for item in split_list(rest):
        name, eq, val = item.partition("=")
        if not eq:
            raise ValueError(f"malformed digest parameter {item[:40]!r}")
        val = val.strip()
        if val.startswith('"') and val.endswith('"') and len(val) >= 2:
            val = val[1:-1]
        out[name.strip().lower()] = val
    return out


@dataclass(frozen=True)
class AuthResult:
    ok: bool
    stale: bool = False
    reason: str = ""


class DigestAuth:
    def __init__(self, username: str, password: str, realm: str, now: Callable[[], float] = time.time) -> None:
        self.username = username
        self.realm = realm
        self._ha1 = _md5(f"{username}:{realm}:{password}")
        self._secret = secrets.token_bytes(16)
        self._now = now

    def _sign(self, stamp: str) -> str:
        return hmac.new(self._secret, stamp.encode(), hashlib.sha256).hexdigest()[:24]

    def challenge(self, stale: bool = False) -> str:
        stamp = f"{self._now():.3f}"
        nonce = f"{stamp}.{self._sign(stamp)}"
        extra = ", stale=true" if stale else ""
        return f'Digest realm="{self.realm}", nonce="{nonce}", algorithm=MD5, qop="auth"{extra}'

    def check(self, method: str, authorization: str | None) -> AuthResult:
        if authorization is None:
            return AuthResult(False, reason="no credentials")
        try:
            p = parse_credentials(authorization)
        except ValueError as exc:
            return AuthResult(False, reason=str(exc))
        for key in ("username", "realm", "nonce", "uri", "response"):
            if key not in p:
                return AuthResult(False, reason=f"credentials lack {key}")
        if p.get("algorithm", "MD5").upper() != "MD5":
            return AuthResult(False, reason=f"unsupported algorithm {p['algorithm'][:20]!r}")
        stamp, _, sig = p["nonce"].rpartition(".")
        if not hmac.compare_digest(sig, self._sign(stamp)):
            return AuthResult(False, reason="nonce was not issued here")
        try:
            age = self._now() - float(stamp)
        except ValueError:
            return AuthResult(False, reason="bad nonce")
        ha2 = _md5(f"{method}:{p['uri']}")
        qop = p.get("qop")
        if qop is None:
            expected = _md5(f"{self._ha1}:{p['nonce']}:{ha2}")  # RFC 2069 compatibility
        elif qop == "auth" and "nc" in p and "cnonce" in p:
            expected = _md5(f"{self._ha1}:{p['nonce']}:{p['nc']}:{p['cnonce']}:auth:{ha2}")
        else:
            return AuthResult(False, reason=f"unsupported qop {qop[:20]!r}")
        if p["username"] != self.username or p["realm"] != self.realm:
            return AuthResult(False, reason="unknown user or realm")
        if not hmac.compare_digest(expected, p["response"].lower()):
            return AuthResult(False, reason="wrong password")
        if not 0 <= age <= NONCE_TTL_S:
            return AuthResult(False, stale=True, reason="nonce expired")
        return AuthResult(True)
