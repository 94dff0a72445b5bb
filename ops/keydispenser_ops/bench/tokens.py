"""An identity provider on loopback for the benches' token variants: an RSA key, its
JWKS served over HTTP from this process, and tokens signed with it."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

ISSUER = "https://issuer.bench.invalid/realms/bench"
AUDIENCE = "keydispenser-bench"
ROLE = "bench"
CLIENT = "bench-client"
KID = "bench-1"


class LocalIssuer:
    """``with LocalIssuer() as issuer:`` serves the JWKS until the block ends."""

    def __init__(self) -> None:
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        public = json.loads(RSAAlgorithm.to_jwk(self._key.public_key()))
        jwks = {"keys": [public | {"kid": KID, "use": "sig", "alg": "RS256"}]}
        body = json.dumps(jwks).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> LocalIssuer:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def jwks_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/certs"

    def oidc(self) -> dict[str, Any]:
        """``dispenser.auth.oidc`` accepting this issuer's tokens for every type."""
        return {
            "providers": [{"issuer": ISSUER, "jwks_url": self.jwks_url}],
            "audiences": [AUDIENCE],
            "algorithms": ["RS256"],
            "roles": {ROLE: {"id_types": ["*"]}},
        }

    def token(self, lifetime_s: float = 3_600) -> str:
        now = int(time.time())
        claims = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "azp": CLIENT,
            "iat": now,
            "exp": now + int(lifetime_s),
            "realm_access": {"roles": [ROLE]},
        }
        return jwt.encode(claims, self._key, "RS256", headers={"kid": KID})
