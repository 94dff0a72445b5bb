"""ID formats: how a pooled type's counters become keys, and which text is one of its keys.

One module per format, each a ``Format`` (``interface.py``) registered in ``FORMATS``
under the ``kind`` that names it in the configuration (``kind: numeric``), which
``PooledKind`` lists. The format answers everything that depends on the kind: its
alphabet and check schemes, lengths and counter domain, the rules it adds, how a
client may write its keys (``normalise``) and which characters the API admits for
them. ``IdType`` (generation, validation, fingerprint), the configuration, the API's
key pattern and OpenG2P's ``/config`` ask the format; none of them branches on the kind.

Adding a format: its module here, its entry in ``FORMATS`` and ``PooledKind`` below,
and its tests (docs/design.md, "Adding an ID format").

Snowflake types are no format: they are minted, not pooled (no counters, domain,
fingerprint or filters), with a configuration model of their own
(``shared.domain.snowflake``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from shared.domain.formats.base62 import Base62
from shared.domain.formats.crockford32 import Crockford32
from shared.domain.formats.interface import Format
from shared.domain.formats.numeric import Numeric

# The configuration's ``kind:`` values of pooled types (a discriminator must be a
# literal), one per format; tests/unit/test_formats.py keeps the two equal.
PooledKind = Literal["numeric", "base62", "crockford32"]
FORMATS: Mapping[str, type[Format]] = {f.kind: f for f in (Numeric, Base62, Crockford32)}


def read_characters() -> frozenset[str]:
    """Every character a client may write a key's core with, in any format."""
    return frozenset("".join(f.read_characters for f in FORMATS.values()))


__all__ = ["FORMATS", "Format", "PooledKind", "read_characters"]
