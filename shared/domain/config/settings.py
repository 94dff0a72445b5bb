"""``Settings``: the whole configuration, composed of each concern's part."""

from __future__ import annotations

import os
from typing import Final, Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SecretsSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from shared.domain.config.dispenser import DispenserConfig
from shared.domain.config.id_types import (
    AnyIdTypeConfig,
    IdTypeConfig,
    check_type_names,
    path_segments,
)
from shared.domain.config.pipeline import LEDGER_READ_BLOCK_S, KeygenConfig, KeysyncConfig
from shared.domain.config.postgres import PostgresSettings
from shared.domain.config.redis import RedisSettings
from shared.domain.errors import ConfigError

# Where systemd puts a unit's credentials (LoadCredential=): read like the environment.
CREDENTIALS_DIRECTORY: Final = "CREDENTIALS_DIRECTORY"
# The fence's detection time, as the refusal of a shorter ledger log names it.
DETECTION_FORMULA: Final = (
    "postgres_connect_timeout_s + keysync.ledger_watch_s + "
    f"{LEDGER_READ_BLOCK_S:g} s (keysync's ledger read block)"
)


class Settings(BaseSettings, PostgresSettings, RedisSettings):
    """Everything a process is configured with: a YAML file plus KD_-prefixed environment
    overrides (env wins). Built once in each process's ``main()`` and passed down."""

    model_config = SettingsConfigDict(
        env_prefix="KD_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    permutation_key: SecretStr | None = None
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # json: one JSON object per line (what log collectors want); console: one readable
    # line per event (`keydispenser up` uses it on a terminal).
    log_format: Literal["json", "console"] = "json"
    # Per logger (and the loggers below it), overriding log_level: {"shared.leases.holder":
    # "DEBUG"} logs every machine-ID lease renewal, for an audit of who held an ID when.
    log_levels: dict[str, Literal["DEBUG", "INFO", "WARNING", "ERROR"]] = Field(
        default_factory=dict
    )
    id_types: dict[str, AnyIdTypeConfig] = Field(default_factory=dict)
    dispenser: DispenserConfig = DispenserConfig()
    keysync: KeysyncConfig = KeysyncConfig()
    keygen: KeygenConfig = KeygenConfig()

    @model_validator(mode="after")
    def _names_are_identifiers(self) -> Settings:
        check_type_names(self.id_types)
        known = {"*", *path_segments(self.id_types)}
        for client in self.dispenser.auth.api_keys:
            unknown = set(client.id_types) - known
            if unknown:
                raise ValueError(
                    f"dispenser.auth.api_keys.{client.name}.id_types: unknown {sorted(unknown)}"
                )
        oidc = self.dispenser.auth.oidc
        for role, grant in (oidc.roles if oidc else {}).items():
            unknown = set(grant.id_types) - known
            if unknown:
                raise ValueError(
                    f"dispenser.auth.oidc.roles.{role}.id_types: unknown {sorted(unknown)}"
                )
        self._mosip_types_keep_a_ledger()
        self._ledger_can_be_restored()
        return self

    @property
    def promotion_detected_s(self) -> float:
        """The fence's detection time: how long after a PostgreSQL promotion keysync may
        take to fence the promoted server (and so stop an old primary still reached by
        some process from trimming the ledger log): a reconnection that first waits out
        a dead host listed before it in the DSN (``postgres_connect_timeout_s``), then
        its ledger loop's next turn (a read block) and look at PostgreSQL
        (``keysync.ledger_watch_s``). ``DETECTION_FORMULA`` names it."""
        return self.postgres_connect_timeout_s + self.keysync.ledger_watch_s + LEDGER_READ_BLOCK_S

    def _ledger_can_be_restored(self) -> None:
        """A type with a ledger needs a ledger log that outlives the fence's detection
        time (docs/reliability.md, "The ledger's one history"): a promotion's lost links
        are trimmed by an old primary still confirming until the fence is seen, so a
        shorter log turns a promotion into a halt by construction, whatever the lag."""
        ledgers = sorted(
            n for n, c in self.id_types.items() if isinstance(c, IdTypeConfig) and c.ledger
        )
        floor = self.promotion_detected_s
        if ledgers and self.keysync.ledger_retain_s < floor:
            raise ValueError(
                f"keysync.ledger_retain_s: {self.keysync.ledger_retain_s:g} s is shorter than "
                f"the PostgreSQL fence's detection time, {floor:g} s = {DETECTION_FORMULA} "
                f"(postgres_connect_timeout_s {self.postgres_connect_timeout_s:g} s, "
                f"keysync.ledger_watch_s {self.keysync.ledger_watch_s:g} s), and id_types "
                f"{', '.join(ledgers)} keep a ledger (ledger: true): a PostgreSQL promotion "
                "would halt it. Keep the log at least that long (and above a replica's worst "
                "lag plus a failover's time), or lower those settings"
            )

    def _mosip_types_keep_a_ledger(self) -> None:
        mosip = self.dispenser.mosip
        for path, name in (("uin", mosip.uin), ("vid", mosip.vid)) if mosip else ():
            if name is None:
                continue
            where = f"dispenser.mosip.{path}"
            config = self.id_types.get(name)
            if config is None:
                raise ValueError(f"{where}: unknown id type {name!r}")
            if not isinstance(config, IdTypeConfig) or not config.ledger:
                raise ValueError(
                    f"{where}: id type {name!r} must be a pooled type with ledger: true "
                    "(MOSIP's status changes are ledger records)"
                )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Order is priority: explicit arguments, then the environment, then the files of
        # systemd's credentials directory (LoadCredential=KD_POSTGRES_DSN:..., one file
        # per variable, named as the variable), then YAML.
        sources = [init_settings, env_settings]
        credentials = os.environ.get(CREDENTIALS_DIRECTORY)
        if credentials:
            sources.append(SecretsSettingsSource(settings_cls, secrets_dir=credentials))
        return (*sources, YamlConfigSettingsSource(settings_cls))

    def pooled(self, name: str) -> IdTypeConfig:
        """The configuration of pooled type ``name`` (of a format, not snowflake)."""
        config = self.id_types[name]
        if not isinstance(config, IdTypeConfig):
            raise ConfigError(f"id_types.{name}: a {config.kind} type, not a pooled one")
        return config

    def key_groups(self) -> dict[str, tuple[str, ...]]:
        """Each Redis key namespace that holds pooled types, and the types it holds:
        one holding every type, or with ``slot_per: type`` one per type. Each has its
        own fence, sync record, ledger stream and wake list (``shared.stores.groups``)."""
        pooled = tuple(n for n, c in self.id_types.items() if isinstance(c, IdTypeConfig))
        if not self.slot_per_type or not pooled:
            return {self.redis_key_namespace: pooled}
        return {self.key_namespace_of(name): (name,) for name in pooled}

    def with_types(self, names: tuple[str, ...]) -> Settings:
        """These settings with only the ID types ``names`` (what one key group serves)."""
        kept = {n: c for n, c in self.id_types.items() if n in names}
        return self.model_copy(update={"id_types": kept})

    def require_permutation_key(self) -> bytes:
        if self.permutation_key is None or not self.permutation_key.get_secret_value():
            raise ConfigError(
                "permutation_key: missing; set KD_PERMUTATION_KEY to a long random secret"
            )
        return self.permutation_key.get_secret_value().encode()
