"""ID types: counters -> keyed permutation -> the type's format (encoding, check scheme,
filters), and validation. Each format lives in ``shared.domain.formats``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from shared.domain import permutation
from shared.domain.config import IdTypeConfig, Settings
from shared.domain.errors import ConfigError, InvalidInput
from shared.domain.filters import Rules
from shared.domain.formats import FORMATS
from shared.domain.formats.text import to_strings
from shared.domain.permutation import FeistelPermutation, derive_key, key_digest

MAX_INPUT = 256  # the longest value read as a key (the API's key pattern says so too)
IDENTITY = "identity"  # the fingerprint's permutation of sequential types


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


class IdType:
    def __init__(self, name: str, config: IdTypeConfig, secret: bytes | None) -> None:
        """``secret`` may be None where keys are only validated, never generated."""
        self.name = name
        self.config = config
        self.rules = Rules.resolve(config.filter_profile, config.length, config.filters)
        self._domain_size = config.domain_size  # (computed by the format: read per key)
        self._key_digest = ""
        self._permutation: FeistelPermutation | None = None
        key = None
        if secret is not None and not self.sequential:
            key = derive_key(secret, name)
            self._key_digest = key_digest(key)
            self._permutation = FeistelPermutation(key, config.domain_size)
        self.format = FORMATS[config.kind](config, self.rules, key)

    @property
    def domain_size(self) -> int:
        return self._domain_size

    @property
    def sequential(self) -> bool:
        """Counter n is key n: no permutation, keys come out in counter order."""
        return self.config.order == "sequential"

    @property
    def fingerprint(self) -> Fingerprint:
        return Fingerprint(
            kind=self.config.kind,
            length=self.config.length,
            alphabet=self.format.alphabet,
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
        chars = self.format.columns(values)
        return to_strings(chars, self.config.prefix, self.config.suffix), stop - start

    def counters_of(self, keys: list[str]) -> list[int | None]:
        """The counter each key (valid, as the stores hold it) is generated from, the
        inverse of ``generate``; None for a key no counter of this type generates."""
        values = [self.format.value_of(self._bare(key)) for key in keys]
        known = [v for v in values if v is not None and v < self.domain_size]
        if self.sequential or not known:
            counters = iter(known)
        elif self._permutation is None:
            raise ConfigError("permutation_key: required to find the counters of keys")
        else:
            inverted = self._permutation.invert(np.array(known, dtype=np.uint64))
            counters = iter(int(c) for c in inverted)
        return [None if v is None or v >= self.domain_size else next(counters) for v in values]

    def keys_of(self, values: list[str]) -> list[str | None]:
        """``normalise`` of each value that ``validate`` accepts, None for the others, a
        block at a time: a value its format reads back to a counter value is valid when
        encoding that value (check symbol, filters: as keygen does) writes it again."""
        cores = [self._readable_core(v) for v in values]
        numbers = [None if c is None else self._number(c) for c in cores]
        known = [n for n in numbers if n is not None]
        written: set[str] = set()
        if known:
            written = set(to_strings(self.format.columns(np.array(known, dtype=np.uint64))))
        out: list[str | None] = []
        for core, number in zip(cores, numbers, strict=True):
            good = core is not None and (
                core in written if number is not None else self.format.valid(core)
            )
            out.append(self.config.prefix + core + self.config.suffix if good and core else None)
        return out

    def _readable_core(self, value: str) -> str | None:
        """The normalised core of ``value`` when it has the type's length, else None."""
        try:
            core = self.core(value.strip())
        except InvalidInput:
            return None
        return core if core is not None and len(core) == self.config.length else None

    def _number(self, core: str) -> int | None:
        """The counter value ``core`` writes (None: none does, or it cannot be read)."""
        try:
            number = self.format.value_of(core)
        except ValueError:
            return None
        return number if number is not None and number < self.domain_size else None

    def _bare(self, key: str) -> str:
        """A stored key without its affixes."""
        return key[len(self.config.prefix) : len(key) - len(self.config.suffix)]

    def validate(self, value: str) -> bool:
        """True when ``value`` is a well-formed key of this type, as a client may write
        it (affixes, length, check scheme, filters)."""
        core = self.core(value)
        if core is None or len(core) != self.config.length:
            return False
        return self.format.valid(core)

    def normalise(self, value: str) -> str:
        """Returns the key ``value`` names, as this type writes its keys (what the stores
        hold): its core in the format's spelling, its affixes as they are; ``value``
        itself when its affixes are not this type's (it names none of its keys).

        Raises InvalidInput for values that cannot be of this type at all.
        """
        core = self.core(value)
        if core is None:
            return value
        return self.config.prefix + core + self.config.suffix

    def core(self, value: str) -> str | None:
        """Returns ``value`` without prefix and suffix, written as the format writes its
        keys (``Format.normalise``); None when the affixes are missing (or overlap).

        Raises InvalidInput for values that cannot be of this type at all.
        """
        if not value or len(value) > MAX_INPUT:
            raise InvalidInput(f"id_value must be 1..{MAX_INPUT} characters")
        prefix, suffix = self.config.prefix, self.config.suffix
        if len(value) < len(prefix) + len(suffix):
            return None  # "X-" with prefix "X-" and suffix "-": no room for a core
        if not value.startswith(prefix) or not value.endswith(suffix):
            return None
        return self.format.normalise(value[len(prefix) : len(value) - len(suffix)])


def build_id_types(settings: Settings, *, generating: bool = True) -> dict[str, IdType]:
    """The pooled types (each of a format): those keygen, keysync and the hot tier serve.
    Snowflake types are minted by dispensers instead (``shared.domain.snowflake``)."""
    pooled = {n: c for n, c in settings.id_types.items() if isinstance(c, IdTypeConfig)}
    if not pooled:
        return {}
    secret = settings.require_permutation_key() if generating else None
    return {name: IdType(name, cfg, secret) for name, cfg in pooled.items()}
