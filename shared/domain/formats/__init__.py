"""ID formats: how a pooled type's counters become keys, and which text is one of its keys.

One module per format, each a ``Format`` (``interface.py``) registered in ``FORMATS``
under the ``kind`` that names it in the configuration (``kind: numeric``). ``IdType``
(generation, validation, fingerprint), the configuration (lengths, defaults, the rules
a kind adds, the counter domain) and OpenG2P's ``/config`` ask the format; none of them
branches on the kind.

Adding a format: its module here, its entry in ``FORMATS``, its ``kind`` in
``PooledKind`` (``shared/domain/config/id_types.py``) and its tests;
``tests/unit/test_formats.py`` checks that the registry and the literal agree.

Snowflake types are no format: they are minted, not pooled (no counters, domain,
fingerprint or filters), with a configuration model of their own
(``shared.domain.snowflake``).
"""

from __future__ import annotations

from collections.abc import Mapping

from shared.domain.formats.base62 import Base62
from shared.domain.formats.interface import Format
from shared.domain.formats.numeric import Numeric

FORMATS: Mapping[str, type[Format]] = {f.kind: f for f in (Numeric, Base62)}

__all__ = ["FORMATS", "Format"]
