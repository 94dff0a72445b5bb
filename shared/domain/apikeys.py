"""API keys are configured as SHA-256 digests; the key itself is shown once, at creation."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

import yaml

ANONYMOUS = "-"  # the client name of requests when no API keys are configured


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_api_key() -> tuple[str, str]:
    """A fresh random API key (256 bits) and the digest to configure for it."""
    key = "kd_" + secrets.token_urlsafe(32)
    return key, digest(key)


# The Python client's default batch (keydispenser_client.Buffering): a key whose burst is
# below it has the client lower its batch on its first request.
CLIENT_DEFAULT_BATCH = 1000


def config_entry(
    name: str,
    key_digest: str,
    id_types: list[str] | None,
    rate_per_s: float | None,
    burst: int | None = None,
) -> str:
    """The YAML to add under ``dispenser.auth.api_keys``."""
    entry: dict[str, Any] = {"name": name, "sha256": key_digest}
    if id_types:
        entry["id_types"] = id_types
    if rate_per_s is not None:
        entry["rate_per_s"] = rate_per_s
    if burst is not None:
        entry["burst"] = burst
    return yaml.safe_dump([entry], sort_keys=False)


def burst_advice(rate_per_s: float | None, burst: int | None) -> str | None:
    """A note when a rate-limited key's burst (the largest count a request may ask
    for; default: a second's worth) is below the Python client's default batch."""
    if rate_per_s is None:
        return None
    effective = burst or max(1, int(rate_per_s))
    if effective >= CLIENT_DEFAULT_BATCH:
        return None
    return (
        f"note: this key may take at most {effective} keys a request (its burst"
        f"{'' if burst else ', a second of --rate'}), below the Python client's default "
        f"batch ({CLIENT_DEFAULT_BATCH}): the client lowers its batch to {effective} on "
        f"its first request and logs a warning. Pass --burst to allow more, or "
        f"Buffering(batch={effective}) in the client."
    )
