"""The one error table (dispenser/codes.py) against what is written elsewhere: docs/api.md's
tables, the OpenAPI document and the answers themselves."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from dispenser import codes, envelope
from dispenser.auth import CountAboveBurst, RateLimited
from shared.domain.errors import IdempotencyMismatch, PoolEmpty, StoreUnavailable

ROOT = Path(__file__).resolve().parents[2]
API_MD = ROOT / "docs" / "api.md"
ROW = re.compile(r"^\| (\d{3}) \| (IDG-\d{3}) \|", re.M)
MOSIP_ROW = re.compile(r"^\| `(KER-[A-Z]+-\d{3})`", re.M)
A_CODE = re.compile(r"\b(IDG|KER-[A-Z]{3})-\d{3}\b")
# The server's and the tooling's code: every answer they give or expect is read from
# the table. (The client, a distribution of its own, speaks the protocol by itself.)
CODE_DIRS = ("dispenser", "keygen", "keysync", "shared", "ops")


def test_docs_table_lists_every_code_with_its_status_and_no_other() -> None:
    documented = {(int(status), code) for status, code in ROW.findall(API_MD.read_text())}
    assert documented == {(entry.status, entry.code) for entry in codes.CODES}


def test_docs_name_every_mosip_code_answered() -> None:
    text = API_MD.read_text()
    documented = set(MOSIP_ROW.findall(text))
    answered = {value.code for value in vars(codes).values() if isinstance(value, codes.MosipCode)}
    # A row may name several codes of one family ("`KER-VID-002` / `003` / `004`").
    for code in answered - documented:
        family, number = code.rsplit("-", 1)
        assert re.search(rf"`{family}-\d{{3}}`[^|]*`{number}`", text), code
    assert {codes.AUTH_FAILED, codes.AUTH_FORBIDDEN} <= set(re.findall(r"KER-ATH-\d{3}", text))


def test_every_code_is_written_once() -> None:
    assert len(codes.BY_CODE) == len(codes.CODES)
    raised = [kind for entry in codes.CODES for kind in entry.raised_by]
    assert len(raised) == len(set(raised))


def written_codes(path: Path) -> list[int]:
    """The lines of ``path`` where a string (not a docstring) holds an error code."""
    tree = ast.parse(path.read_text(), str(path))
    owners = [
        tree,
        *(
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        ),
    ]
    docs = {
        id(owner.body[0].value)
        for owner in owners
        if owner.body and isinstance(owner.body[0], ast.Expr)
    }
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str | bytes)
        and id(node) not in docs
        and A_CODE.search(node.value if isinstance(node.value, str) else node.value.decode())
    ]


def test_no_code_is_written_outside_the_table() -> None:
    """An answer a process or the tooling gives or expects names its code through
    ``dispenser.codes``, never by restating it."""
    table = ROOT / "dispenser" / "codes.py"
    assert written_codes(table)  # control: the scan finds the codes where they are
    restated = {
        f"{path.relative_to(ROOT)}:{line}"
        for folder in CODE_DIRS
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != table
        for line in written_codes(path)
    }
    assert restated == set()


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (PoolEmpty("t", 3), 503, "IDG-001"),
        (StoreUnavailable("redis", "down"), 503, "IDG-005"),
        (IdempotencyMismatch("k"), 422, "IDG-004"),  # a subclass: its base's code
        (CountAboveBurst("c", 50, 5), 422, "IDG-004"),
        (RateLimited("c", 2), 429, "IDG-010"),
    ],
)
def test_an_error_is_answered_with_its_tables_status_and_code(
    error: Exception, status: int, code: str
) -> None:
    answered, headers, body = envelope.from_domain(error)  # type: ignore[arg-type]
    assert (answered, f'"errorCode":"{code}"' in body.decode()) == (status, True)
    retry = dict(headers).get("retry-after")
    assert (retry is not None) == codes.BY_CODE[code].retry_after


def test_the_openapi_texts_come_from_the_table() -> None:
    from dispenser.openapi import document
    from shared.domain.config import Settings

    spec = document(Settings.model_validate({"id_types": {}}), "test")
    texts: dict[str, set[str]] = {}
    for path in spec["paths"].values():
        for operation in path.values():
            for status, answer in operation.get("responses", {}).items():
                texts.setdefault(status, set()).add(answer["description"])
    for status in ("401", "404", "410", "422", "429", "503"):
        assert codes.described(int(status)) in texts[status], status
