"""OpenG2P's ID Generator shapes: /config's id_types and global filter_rules, /version's
build metadata. Field names follow OpenG2P; this service's own fields sit beside them."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata
from typing import Any

from shared.domain.idtypes import IdType
from shared.domain.snowflake import BASE62_WIDTH, DECIMAL_WIDTH, SnowflakeType


def type_config(id_type: IdType) -> dict[str, Any]:
    """OpenG2P's ``id_length``, and this service's per-type settings beside it."""
    return {
        "id_length": id_type.config.length,
        "kind": id_type.config.kind,
        "length": id_type.config.length,
        "aliases": list(id_type.config.aliases),
        "order": id_type.config.order,
        "check_digit": id_type.config.check_digit,
        "filter_profile": id_type.config.filter_profile,
        "filters": id_type.config.filters.model_dump(),
        "filter_rules": rules(id_type),
        "ledger": id_type.config.ledger,
    }


def snowflake_config(id_type: SnowflakeType) -> dict[str, Any]:
    """A snowflake type: ``id_length`` is the longest text of one of its IDs."""
    config = id_type.config
    lo, hi = id_type.machine_range
    return {
        "id_length": DECIMAL_WIDTH if config.text == "decimal" else BASE62_WIDTH,
        "kind": "snowflake",
        "text": config.text,
        "epoch_ms": config.epoch,
        "bits": config.bits.model_dump(),
        "machine_ids": {"pool": id_type.pool, "min": lo, "max": hi},
        "max_backwards_ms": config.max_backwards_ms,
        "ledger": False,
    }


def global_rules_type(id_types: dict[str, IdType]) -> IdType | None:
    """OpenG2P's filter rules are global, ours per type: the global block describes
    the first type whose format is filtered (numeric) with the openg2p profile, else the
    first filtered type, else the first type."""
    filtered = [t for t in id_types.values() if t.format.filtered]
    openg2p = [t for t in filtered if t.config.filter_profile == "openg2p"]
    chosen = openg2p or filtered or list(id_types.values())
    return chosen[0] if chosen else None


def rules(id_type: IdType) -> dict[str, Any]:
    """A type's filter limits under OpenG2P's names."""
    limits = id_type.rules
    return {
        "sequence_limit": limits.sequence,
        "repeating_limit": limits.repeating_digit,
        "repeating_block_limit": limits.repeating_block,
        "conjugative_even_digits_limit": limits.conjugative_even,
        "digits_group_limit": limits.first_equals_last,
        "reverse_digits_group_limit": limits.first_equals_reverse,
        "not_start_with": list(limits.not_start_with),
        "restricted_numbers": list(limits.restricted),
    }


def build_info(environ: Mapping[str, str]) -> dict[str, str]:
    """OpenG2P's build metadata: the package version, and the build time and commit
    the image was built with (``KEYDISPENSER_BUILD_TIME``, ``KEYDISPENSER_GIT_COMMIT``)."""
    return {
        "service_version": metadata.version("keydispenser"),
        "build_time": environ.get("KEYDISPENSER_BUILD_TIME") or "unknown",
        "git_commit": environ.get("KEYDISPENSER_GIT_COMMIT") or "unknown",
    }
