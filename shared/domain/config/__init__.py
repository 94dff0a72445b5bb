"""Configuration, by concern: each module holds the models of what it configures.

- ``id_types``: ID types (pooled, of a format; snowflake), their names and aliases;
- ``dispenser``: the HTTP server, its limits, API keys;
- ``redis``: one server or Sentinel (with TLS), the namespace, lease replication;
- ``postgres``: the DSN, the PostgreSQL fence;
- ``pipeline``: keygen and keysync;
- ``settings``: ``Settings``, composed of the above; ``loader``: reading it, and
  saying what is wrong with it.

A name is imported from its module when first asked of the package, so that code which
needs one concern (the lease library: ``redis``) loads only that one.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shared.domain.config.dispenser import (
        ApiKeyConfig,
        AuthConfig,
        DispenserConfig,
        MosipConfig,
        OidcConfig,
    )
    from shared.domain.config.id_types import (
        FilterLimits,
        IdTypeConfig,
        Site,
        SnowflakeConfig,
        Watermarks,
        path_segments,
    )
    from shared.domain.config.loader import default_config_path, describe, load_settings
    from shared.domain.config.pipeline import KeygenConfig, KeysyncConfig
    from shared.domain.config.redis import ClusterConfig, SentinelConfig, ServerAccess
    from shared.domain.config.settings import Settings

# Each public name, and the module that holds it.
_HOMES = {
    **dict.fromkeys(
        ("ApiKeyConfig", "AuthConfig", "DispenserConfig", "MosipConfig", "OidcConfig"),
        "dispenser",
    ),
    **dict.fromkeys(
        ("FilterLimits", "IdTypeConfig", "Site", "SnowflakeConfig", "Watermarks"), "id_types"
    ),
    "path_segments": "id_types",
    **dict.fromkeys(("default_config_path", "describe", "load_settings"), "loader"),
    **dict.fromkeys(("KeygenConfig", "KeysyncConfig"), "pipeline"),
    **dict.fromkeys(("ClusterConfig", "SentinelConfig", "ServerAccess"), "redis"),
    "Settings": "settings",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


__all__ = [
    "ApiKeyConfig",
    "AuthConfig",
    "ClusterConfig",
    "DispenserConfig",
    "FilterLimits",
    "IdTypeConfig",
    "KeygenConfig",
    "KeysyncConfig",
    "MosipConfig",
    "OidcConfig",
    "SentinelConfig",
    "ServerAccess",
    "Settings",
    "Site",
    "SnowflakeConfig",
    "Watermarks",
    "default_config_path",
    "describe",
    "load_settings",
    "path_segments",
]
