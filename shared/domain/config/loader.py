"""Loading the settings (the YAML file, then the environment) and saying what is wrong
with them in the configuration's own terms."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic import ValidationError

from shared.domain.config.id_types import ID_KINDS
from shared.domain.config.settings import Settings
from shared.domain.errors import ConfigError

# KD_CONFIG=builtin (or --config builtin): the shipped configuration, on purpose. A
# process or operator command given no configuration at all refuses (shared/cli/main.py).
BUILTIN: Final = "builtin"


def default_config_path() -> Path:
    return Path(str(resources.files("shared.domain").joinpath("default.yaml")))


def config_file(config_path: str | os.PathLike[str] | None = None) -> Path | None:
    """The configuration file named (``config_path``, else KD_CONFIG; ``builtin``: the
    shipped one); None when none is named."""
    named = config_path or os.environ.get("KD_CONFIG")
    if not named:
        return None
    return default_config_path() if str(named) == BUILTIN else Path(named)


def load_settings(config_path: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Read the YAML file (KD_CONFIG, else the shipped default) and the environment."""
    path = config_file(config_path) or default_config_path()
    if not path.is_file():
        raise ConfigError(f"KD_CONFIG: configuration file not found: {path}")
    bound = type(
        "BoundSettings", (Settings,), {"model_config": {**Settings.model_config, "yaml_file": path}}
    )
    try:
        settings: Settings = bound(**overrides)
    except ValidationError as exc:
        raise ConfigError(describe(exc)) from exc
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    return settings


def describe(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        field = ".".join(str(part) for part in _located(err["loc"], err["type"])) or "(root)"
        message = err["msg"].removeprefix("Value error, ")
        lines.append(f"{field}: {message}")
    return "invalid configuration: " + "; ".join(lines)


def _located(loc: tuple[int | str, ...], kind: str) -> tuple[int | str, ...]:
    """An error's location as the YAML names it: without the kind pydantic puts after
    an ID type's name, and ending in ``kind`` when the kind itself is unknown."""
    if len(loc) >= 3 and loc[0] == "id_types" and loc[2] in ID_KINDS:
        loc = loc[:2] + loc[3:]
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        loc = (*loc, "kind")
    return loc
