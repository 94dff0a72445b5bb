"""What a name in the configuration may be: ID types (and lease pools, named like
them), aliases in request paths, prefixes and suffixes. Anchored for OpenAPI; match
them with fullmatch (a $ also matches before a final newline)."""

from __future__ import annotations

import re

ID_TYPE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,40}$")
AFFIX = re.compile(r"^[A-Za-z0-9_.:-]{0,16}$")  # safe in a URL path segment
# Another name for a type in request paths (a registry's own code, e.g. "FAR-"): one
# URL path segment that needs no percent-encoding, and never "." or "..".
ALIAS = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,40}$")
