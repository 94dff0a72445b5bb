"""The fast path's path pattern, derived from the route template and the alias pattern
(which admits every type name: a segment that names no configured type goes on to the
route)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.routing import Route

from dispenser.routes import ROUTES
from dispenser.single import ALLOCATE_ONE, ALLOCATE_ONE_PATH, path_pattern
from shared.domain.names import ALIAS, ID_TYPE_NAME


def test_the_fast_path_serves_the_route_it_is_derived_from() -> None:
    allocate_one = [r for r in ROUTES if isinstance(r, Route) and r.path == ALLOCATE_ONE]
    assert [r.methods for r in allocate_one] == [{"POST"}]


def test_a_single_id_path_matches_with_its_type_name() -> None:
    match = ALLOCATE_ONE_PATH.match("/v1/idgenerator/farmer/id")
    assert match is not None and match["name"] == "farmer"


@pytest.mark.parametrize(
    "path",
    [
        "/v1/idgenerator/farmer/id\n",  # $ would let this through
        "/v1/idgenerator/farmer\n/id",
        "/v1/idgenerator/.farmer/id",  # "." and ".." are never aliases
        "/v1/idgenerator/../id",
        "/v1/idgenerator/far mer/id",
        "/v1/idgenerator/FAR:/id",
        "/v1/idgenerator/" + "f" * 42 + "/id",  # one character too long
        "/v1/idgenerator//id",
        "/v1/idgenerator/farmer/id/",
        "/v1/idgenerator/farmer/id/extra",
        "/v1/idgenerator/farmer/extra/id",
        "/extra/v1/idgenerator/farmer/id",
        "/v1/idgenerator/farmer/id/validate/3029384756",
    ],
)
def test_other_paths_do_not_match(path: str) -> None:
    assert ALLOCATE_ONE_PATH.match(path) is None


@given(st.from_regex(ID_TYPE_NAME, fullmatch=True))
def test_every_valid_type_name_is_captured_whole(name: str) -> None:
    match = ALLOCATE_ONE_PATH.match(f"/v1/idgenerator/{name}/id")
    assert match is not None and match["name"] == name


@given(st.from_regex(ALIAS, fullmatch=True))
def test_every_valid_alias_is_captured_whole(alias: str) -> None:
    match = ALLOCATE_ONE_PATH.match(f"/v1/idgenerator/{alias}/id")
    assert match is not None and match["name"] == alias


def test_template_characters_are_literal() -> None:
    pattern = path_pattern("/a.b/{id_type}", ID_TYPE_NAME)
    assert pattern.match("/a.b/farmer") is not None
    assert pattern.match("/axb/farmer") is None


@pytest.mark.parametrize("template", ["/v1/keys", "/{id_type}/{id_type}"])
def test_a_template_needs_one_placeholder(template: str) -> None:
    with pytest.raises(ValueError, match="id_type"):
        path_pattern(template, ID_TYPE_NAME)


def test_the_type_name_pattern_must_be_anchored() -> None:
    with pytest.raises(ValueError, match="anchored"):
        path_pattern(ALLOCATE_ONE, re.compile("[a-z]+"))


def test_every_route_matches_whole_paths_only() -> None:
    """Starlette's ``$`` anchor would serve ``/v1/idgenerator/farmer/id\\n`` as the route."""
    for route in ROUTES:
        assert isinstance(route, Route)
        assert route.path_regex.pattern.endswith(r"\Z"), route.path
    allocate_one = next(r for r in ROUTES if isinstance(r, Route) and r.path == ALLOCATE_ONE)
    scope = {"type": "http", "path": "/v1/idgenerator/farmer/id\n", "method": "POST"}
    assert allocate_one.matches(scope)[0].name == "NONE"
