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


def config_entry(
    name: str, key_digest: str, id_types: list[str] | None, rate_per_s: float | None
) -> str:
    """The YAML to add under ``dispenser.auth.api_keys``."""
    entry: dict[str, Any] = {"name": name, "sha256": key_digest}
    if id_types:
        entry["id_types"] = id_types
    if rate_per_s is not None:
        entry["rate_per_s"] = rate_per_s
    return yaml.safe_dump([entry], sort_keys=False)
