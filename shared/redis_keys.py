"""Every Redis key name keydispenser uses, built by small functions."""

from __future__ import annotations

PREFIX = "kd"


def hot_list_key(id_type: str) -> str:
    """The hot list of an ID type: keys ready to dispense, FIFO."""
    return f"{PREFIX}:hot:{id_type}"


def keysync_wake_key() -> str:
    """A short list that dispensers push ID-type names to when a hot list runs low."""
    return f"{PREFIX}:keysync:wake"


def exhausted_key(id_type: str) -> str:
    """Set once a type's sequence is used up and its cold table is empty."""
    return f"{PREFIX}:exhausted:{id_type}"
