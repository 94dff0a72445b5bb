"""ID types: counters -> keyed permutation -> encoding -> filters, and validation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from shared.checkdigit import verhoeff_digits_np, verhoeff_valid
from shared.errors import ConfigError, InvalidInput
from shared.filters import rejected_by
from shared.permutation import FeistelPermutation, derive_key, key_digest
from shared.settings import BASE62_ALPHABET, IdTypeConfig, Settings
from shared.vfilters import openg2p_reject

_BASE62_BYTES = np.frombuffer(BASE62_ALPHABET.encode(), dtype=np.uint8)
_MAX_INPUT = 256


@dataclass(frozen=True)
class Fingerprint:
    """The immutable keyspace definition of an ID type (DESIGN invariant 5)."""

    kind: str
    length: int
    alphabet: str
    check_digit: str
    range_size: int
    permutation_key_digest: str

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class IdType:
    def __init__(self, name: str, config: IdTypeConfig, secret: bytes | None) -> None:
        """``secret`` may be None where keys are only validated, never generated."""
        self.name = name
        self.config = config
        self._key_digest = ""
        self._permutation: FeistelPermutation | None = None
        if secret is not None:
            key = derive_key(secret, name)
            self._key_digest = key_digest(key)
            self._permutation = FeistelPermutation(key, config.domain_size)

    @property
    def domain_size(self) -> int:
        return self.config.domain_size

    @property
    def fingerprint(self) -> Fingerprint:
        numeric = self.config.kind == "numeric"
        return Fingerprint(
            kind=self.config.kind,
            length=self.config.length,
            alphabet="0123456789" if numeric else BASE62_ALPHABET,
            check_digit="verhoeff" if numeric else "none",
            range_size=self.config.range_size,
            permutation_key_digest=self._key_digest,
        )

    def generate(self, start: int, stop: int) -> tuple[list[str], int]:
        """Keys for the counters ``[start, stop)``: (accepted keys, candidates)."""
        stop = min(stop, self.domain_size)
        if stop <= start:
            return [], 0
        if self._permutation is None:
            raise ConfigError("permutation_key: required to generate keys")
        counters = np.arange(start, stop, dtype=np.uint64)
        values = self._permutation.permute(counters)
        if self.config.kind == "numeric":
            chars = self._numeric_digits(values)
        else:
            chars = _BASE62_BYTES[_radix_digits(values, 62, self.config.length)]
        return _rows_to_strings(chars), int(counters.size)

    def _numeric_digits(self, values: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint8]:
        body = _radix_digits(values, 10, self.config.length - 1)
        digits = np.concatenate([body, verhoeff_digits_np(body)[:, None]], axis=1)
        if self.config.filter_profile == "openg2p":
            digits = digits[~openg2p_reject(digits, self.config.length, self.config.filters)]
        chars: npt.NDArray[np.uint8] = digits + np.uint8(48)
        return chars

    def validate(self, value: str) -> bool:
        """True when ``value`` is a well-formed key of this type (check digit, filters)."""
        self.check_well_formed(value)
        if len(value) != self.config.length:
            return False
        if self.config.kind == "base62":
            return True
        if not verhoeff_valid(value):
            return False
        if self.config.filter_profile == "none":
            return True
        return not rejected_by(value, self.config.length, self.config.filters)

    def check_well_formed(self, value: str) -> None:
        """Raise InvalidInput for values that cannot be of this type at all."""
        alphabet = "0123456789" if self.config.kind == "numeric" else BASE62_ALPHABET
        if not value or len(value) > _MAX_INPUT or not set(value) <= set(alphabet):
            raise InvalidInput(
                f"id_value must be 1..{_MAX_INPUT} characters from the {self.config.kind} alphabet"
            )


def _radix_digits(values: npt.NDArray[np.uint64], radix: int, width: int) -> npt.NDArray[np.uint8]:
    """Zero-padded base-``radix`` digits, most significant first, one row per value."""
    out = np.empty((values.size, width), dtype=np.uint8)
    rest = values.copy()
    base = np.uint64(radix)
    for col in range(width - 1, -1, -1):
        out[:, col] = rest % base
        rest //= base
    return out


def _rows_to_strings(chars: npt.NDArray[np.uint8]) -> list[str]:
    if chars.size == 0:
        return []
    width = chars.shape[1]
    text = np.ascontiguousarray(chars).tobytes().decode("ascii")
    return [text[i : i + width] for i in range(0, len(text), width)]


def build_id_types(settings: Settings, *, generating: bool = True) -> dict[str, IdType]:
    secret = settings.require_permutation_key() if generating else None
    return {name: IdType(name, cfg, secret) for name, cfg in settings.id_types.items()}
