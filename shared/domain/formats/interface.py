"""What a format answers: for the configuration (the class), and for one type (an
instance bound to its settings, filter rules and permutation key)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

from shared.domain.errors import InvalidInput

if TYPE_CHECKING:
    from shared.domain.arrays import U64, Cols
    from shared.domain.config import IdTypeConfig
    from shared.domain.filters import Rules


class Format(ABC):
    """One kind of pooled key: its text, its check scheme, its keyspace, how a client may
    write one of its keys, and what makes a text one of them.

    ``columns`` encodes a whole block of counter values at once (numpy columns), and
    ``normalise`` and ``valid`` are one cheap call each per request: no per-key Python
    on the generation path.
    """

    kind: ClassVar[str]  # the configuration's ``kind:`` value
    alphabet: ClassVar[str]  # the symbols a key's counter is written in (in the fingerprint)
    # Every character a key's core holds as generated: the alphabet, and any check
    # symbols of its own.
    key_characters: ClassVar[str]
    # Every character a client may write a core with, in a lookup or a status change
    # (``normalise`` reads them as key characters). The API's key pattern
    # (dispenser/openapi.py) admits these.
    read_characters: ClassVar[str]
    # The ``check_digit:`` values this format honours, its default first.
    check_schemes: ClassVar[tuple[str, ...]]
    length_limits: ClassVar[tuple[int, int]]  # the settable lengths, both ends included
    filtered: ClassVar[bool]  # its keys go through the type's filter profile

    @classmethod
    def check(cls, config: IdTypeConfig) -> None:
        """Raise ValueError for a setting this format cannot honour (the length and the
        check scheme are checked against ``length_limits`` and ``check_schemes`` before).
        By default every setting is."""
        return

    @classmethod
    @abstractmethod
    def domain_size(cls, config: IdTypeConfig) -> int:
        """Number of counters of a type: its keyspace before filters."""

    def __init__(self, config: IdTypeConfig, rules: Rules, key: bytes | None) -> None:
        """``key``: the type's permutation key; None where keys are only validated."""
        self.config = config
        self.rules = rules
        self._readable = frozenset(self.read_characters)

    @abstractmethod
    def columns(self, values: U64) -> Cols:
        """ASCII codes of the cores of the keys that ``values`` (permuted counters, or
        plain ones for a sequential type) make, one column per accepted key, in order."""

    def normalise(self, core: str) -> str:
        """Returns ``core`` (affixes stripped) written as this format writes its keys:
        the text the stores hold and ``valid`` reads. A format that reads other
        spellings (another case, look-alike letters) maps them here; by default a core
        is written one way only.

        Raises InvalidInput for a character no key of this format is written with.
        """
        if not self._readable.issuperset(core):
            raise InvalidInput(f"id_value must use the {self.kind} alphabet")
        return core

    @abstractmethod
    def valid(self, core: str) -> bool:
        """True when ``core`` (normalised, its length checked) is one of this format's keys."""

    @abstractmethod
    def value_of(self, core: str) -> int | None:
        """The (permuted) counter value a valid ``core`` is written from, the inverse of
        ``columns``; None when no counter value writes it (keygen never makes it)."""
