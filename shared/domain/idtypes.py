"""ID types: counters -> keyed permutation -> encoding -> filters, and validation."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from shared.domain import permutation
from shared.domain.arrays import U64, Cols
from shared.domain.checkdigit import verhoeff_columns, verhoeff_valid
from shared.domain.config import IdTypeConfig, Settings
from shared.domain.config.idtypes import BASE62_ALPHABET
from shared.domain.errors import ConfigError, InvalidInput
from shared.domain.filters import Rules, rejected_by
from shared.domain.numeric import ChunkFilter, split_chunks
from shared.domain.permutation import FeistelPermutation, derive_key, key_digest
from shared.domain.vfilters import prefilter, reject

_MAX_INPUT = 256
_ASCII_ZERO = np.uint8(48)
_BASE62_BYTES = np.frombuffer(BASE62_ALPHABET.encode(), dtype=np.uint8)
# _DECIMAL4[:, v] are the 4 digits of v; _BASE62_2[:, v] the 2 base-62 characters.
_DECIMAL4 = np.array([[int(c) for c in f"{v:04d}"] for v in range(10_000)], dtype=np.uint8).T
_BASE62_2 = np.array([[v // 62, v % 62] for v in range(62 * 62)], dtype=np.uint8).T
IDENTITY = "identity"  # the fingerprint's permutation of sequential types
_HEAD_MIX = (np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53), np.uint64(33))


@dataclass(frozen=True)
class Fingerprint:
    """An ID type's immutable keyspace (invariant immutable-keyspace, docs/design.md)."""

    kind: str
    length: int
    alphabet: str
    check_digit: str
    prefix: str
    suffix: str
    range_size: int
    counter_domain: int
    permutation: str
    permutation_key_digest: str
    # The site's share (index, of); absent without a site, so that fingerprints
    # recorded before sites existed still match.
    site: tuple[int, int] | None = None

    def as_dict(self) -> dict[str, Any]:
        fields = asdict(self)
        if self.site is None:
            del fields["site"]
        else:
            fields["site"] = {"index": self.site[0], "of": self.site[1]}
        return fields


def radix_columns(values: U64, width: int, radix: int) -> Cols:
    """Zero-padded digits of ``values``, most significant first, one column per digit."""
    out = np.empty((width, values.size), dtype=np.uint8)
    if radix == 10:
        # uint64 division is slow: cut into 8-digit uint32 pieces first.
        rest, end = values, width
        while end > 0:
            take = min(8, end)
            if end > take:
                quotient = rest // np.uint64(10**take)
                piece = rest - quotient * np.uint64(10**take)
                rest = quotient
            else:
                piece = rest
            _fill_columns(out[end - take : end], piece.astype(np.uint32), 10)
            end -= take
    else:
        _fill_columns(out, values, radix)
    return out


def _fill_columns(out: Cols, values: npt.NDArray[Any], radix: int) -> None:
    """Digits of ``values`` (each fits ``out``) via 4-digit/2-char lookup tables.

    Written for numpy's speed profile: ``//`` by a scalar is fast, ``%`` is not,
    and gathering one table row at a time beats a 2-D gather.
    """
    table, chunk = (_DECIMAL4, 4) if radix == 10 else (_BASE62_2, 2)
    rest = values
    end = out.shape[0]
    while end > 0:
        take = min(chunk, end)
        if end > take:
            base = rest.dtype.type(radix**take)
            quotient = rest // base
            part = (rest - quotient * base).astype(np.intp)
            rest = quotient
        else:
            part = rest.astype(np.intp)
        for j in range(take):
            out[end - take + j] = table[chunk - take + j][part]
        end -= take


def to_strings(cols: Cols, prefix: str = "", suffix: str = "") -> list[str]:
    """One string per column-stacked ID (``cols`` holds ASCII codes)."""
    m, n = cols.shape
    if n == 0:
        return []
    p, width = len(prefix), len(prefix) + m + len(suffix)
    rows = np.empty((n, width), dtype=np.uint8)
    rows[:, :p] = np.frombuffer(prefix.encode(), dtype=np.uint8)
    rows[:, p : p + m] = cols.T
    rows[:, p + m :] = np.frombuffer(suffix.encode(), dtype=np.uint8)
    text = rows.tobytes().decode("ascii")
    return [text[i : i + width] for i in range(0, len(text), width)]


class IdType:
    def __init__(self, name: str, config: IdTypeConfig, secret: bytes | None) -> None:
        """``secret`` may be None where keys are only validated, never generated."""
        self.name = name
        self.config = config
        self.rules = Rules.resolve(config.filter_profile, config.length, config.filters)
        self._chunk_filter = ChunkFilter(self.rules, config.counter_digits)
        self._key_digest = ""
        self._permutation: FeistelPermutation | None = None
        self._head_key = np.uint64(0)
        if secret is not None and not self.sequential:
            key = derive_key(secret, name)
            self._key_digest = key_digest(key)
            self._permutation = FeistelPermutation(key, config.domain_size)
            self._head_key = np.uint64(int.from_bytes(key[-8:], "big"))

    @property
    def domain_size(self) -> int:
        return self.config.domain_size

    @property
    def sequential(self) -> bool:
        """Counter n is key n: no permutation, keys come out in counter order."""
        return self.config.order == "sequential"

    @property
    def fingerprint(self) -> Fingerprint:
        numeric = self.config.kind == "numeric"
        return Fingerprint(
            kind=self.config.kind,
            length=self.config.length,
            alphabet="0123456789" if numeric else BASE62_ALPHABET,
            check_digit=self.config.check_digit,
            prefix=self.config.prefix,
            suffix=self.config.suffix,
            range_size=self.config.range_size,
            counter_domain=self.domain_size,
            permutation=IDENTITY if self.sequential else permutation.ALGORITHM,
            permutation_key_digest=self._key_digest,
            site=None if (site := self.config.site) is None else (site.index, site.of),
        )

    def generate(self, start: int, stop: int) -> tuple[list[str], int]:
        """Keys for the counters ``[start, stop)``: (accepted keys, candidates)."""
        stop = min(stop, self.domain_size)
        if stop <= start:
            return [], 0
        counters = np.arange(start, stop, dtype=np.uint64)
        if self.sequential:
            values = counters
        elif self._permutation is None:
            raise ConfigError("permutation_key: required to generate keys")
        else:
            values = self._permutation.permute(counters)
        if self.config.kind == "numeric" and self.sequential:
            chars = self._in_order(values) + _ASCII_ZERO
        elif self.config.kind == "numeric":
            chars = self._numeric(values) + _ASCII_ZERO
        else:
            chars = _BASE62_BYTES[radix_columns(values, self.config.length, 62)]
        return to_strings(chars, self.config.prefix, self.config.suffix), stop - start

    def _numeric(self, values: U64) -> Cols:
        """Body digits, cheap prefilters, check digit for survivors, full filters."""
        head_width = self.config.length - 1 - self.config.counter_digits
        if head_width:
            body = radix_columns(values, self.config.counter_digits, 10)
            body = np.concatenate([self._head(values, head_width), body])
            body = body[:, ~prefilter(body, self.rules, 1)]
        else:
            chunks = split_chunks(values, self.config.counter_digits)
            alive = self._chunk_filter.survivors(chunks)
            body = self._chunk_filter.expand([chunk[alive] for chunk in chunks])
        body = body[:, ~prefilter(body, self.rules, 2)]
        full = np.concatenate([body, verhoeff_columns(body)[None, :]])
        kept: Cols = full[:, ~reject(full, self.rules)]
        return kept

    def _in_order(self, values: U64) -> Cols:
        """Zero-padded counters, the check digit if any, the filters if any."""
        body = radix_columns(values, self.config.counter_digits, 10)
        padding = self.config.body_digits - self.config.counter_digits
        if padding:
            body = np.concatenate([np.zeros((padding, values.size), dtype=np.uint8), body])
        if self.config.check_digit == "verhoeff":
            body = np.concatenate([body, verhoeff_columns(body)[None, :]])
        kept: Cols = body[:, ~reject(body, self.rules)]
        return kept

    def _head(self, values: U64, width: int) -> Cols:
        """Leading digits of a long type: a keyed hash of the (unique) tail value."""
        m1, m2, s = _HEAD_MIX
        x = values ^ self._head_key
        x = (x ^ (x >> s)) * m1
        x = (x ^ (x >> s)) * m2
        x = x ^ (x >> s)
        return radix_columns(x % np.uint64(10**width), width, 10)

    def validate(self, value: str) -> bool:
        """True when ``value`` is a well-formed key of this type (affixes, check digit, filters)."""
        core = self.core(value)
        if core is None or len(core) != self.config.length:
            return False
        if self.config.kind == "base62":
            return True
        if self.config.check_digit == "verhoeff" and not verhoeff_valid(core):
            return False
        return not rejected_by(core, self.rules)

    def core(self, value: str) -> str | None:
        """``value`` without prefix/suffix; None when they are missing.

        Raises InvalidInput for values that cannot be of this type at all.
        """
        if not value or len(value) > _MAX_INPUT:
            raise InvalidInput(f"id_value must be 1..{_MAX_INPUT} characters")
        prefix, suffix = self.config.prefix, self.config.suffix
        if not value.startswith(prefix) or not value.endswith(suffix):
            return None
        core = value[len(prefix) : len(value) - len(suffix)]
        alphabet = "0123456789" if self.config.kind == "numeric" else BASE62_ALPHABET
        if not set(core) <= set(alphabet):
            raise InvalidInput(f"id_value must use the {self.config.kind} alphabet")
        return core


def build_id_types(settings: Settings, *, generating: bool = True) -> dict[str, IdType]:
    """The pooled types (numeric, base62): those keygen, keysync and the hot tier serve.
    Snowflake types are minted by dispensers instead (``shared.domain.snowflake``)."""
    pooled = {n: c for n, c in settings.id_types.items() if isinstance(c, IdTypeConfig)}
    if not pooled:
        return {}
    secret = settings.require_permutation_key() if generating else None
    return {name: IdType(name, cfg, secret) for name, cfg in pooled.items()}
