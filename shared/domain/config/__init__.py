"""Configuration, by concern: each module holds the models of what it configures.

- ``idtypes``: ID types (numeric, base62, snowflake), their names and aliases;
- ``dispenser``: the HTTP server, its limits, API keys;
- ``redis``: one server or Sentinel (with TLS), the namespace, lease replication;
- ``postgres``: the DSN, the PostgreSQL fence;
- ``pipeline``: keygen and keysync;
- ``settings``: ``Settings``, composed of the above; ``loader``: reading it, and
  saying what is wrong with it.
"""

from shared.domain.config.dispenser import (
    ApiKeyConfig,
    AuthConfig,
    DispenserConfig,
    MosipConfig,
    OidcConfig,
)
from shared.domain.config.idtypes import (
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
