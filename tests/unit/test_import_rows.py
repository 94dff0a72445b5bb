"""What an import makes of a source's rows (``shared.domain.imports``), and its progress."""

from __future__ import annotations

import io

from shared.cli.imports import Progress
from shared.domain.config import IdTypeConfig
from shared.domain.idtypes import IdType
from shared.domain.imports import MOSIP_UIN, Intake, SourceRow, file_row

TYPE = IdType("t", IdTypeConfig(kind="numeric", length=6, filter_profile="none"), b"unit")
KEYS, _ = TYPE.generate(0, 10)


def test_a_file_line_is_an_id_and_maybe_a_status() -> None:
    assert file_row("123456\n", "ISSUED") == SourceRow("123456", "ISSUED")
    assert file_row(" 123456,taken ", "ISSUED") == SourceRow("123456", "taken")
    assert file_row("123456\tASSIGNED", "ISSUED") == SourceRow("123456", "ASSIGNED")
    assert file_row("123456   UNUSED", "ISSUED") == SourceRow("123456", "UNUSED")
    assert file_row("   ", "ISSUED") is None and file_row("# a comment", "ISSUED") is None


def test_statuses_say_issued_and_used_and_unknown_ones_refuse() -> None:
    intake = Intake(TYPE, MOSIP_UIN)
    rows = [
        SourceRow(KEYS[0], "UNUSED"),
        SourceRow(KEYS[1], " issued "),
        SourceRow(KEYS[2], "ASSIGNED"),
        SourceRow(KEYS[3], "REVOKED"),
        SourceRow(KEYS[4], None),
    ]
    staged = intake.take(rows)
    assert [(s[0], s[2], s[5], s[6]) for s in staged] == [
        (KEYS[0], "UNUSED", False, False),
        (KEYS[1], "ISSUED", True, False),
        (KEYS[2], "ASSIGNED", True, True),
    ]
    assert all(s[1] is not None for s in staged)  # each with its counter
    refusal = intake.refusal()
    assert refusal is not None and "'REVOKED' (1 rows)" in refusal and "None (1 rows)" in refusal


def test_ids_that_are_no_keys_of_the_type_are_counted_by_example() -> None:
    intake = Intake(TYPE, MOSIP_UIN)
    wrong = [f"x{i}" for i in range(8)]
    intake.take([SourceRow(v, "ISSUED") for v in [*wrong, KEYS[0]]])
    assert intake.invalid == 8 and intake.invalid_examples == wrong[:5]
    assert intake.refusal() is None


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_shows_rows_rate_and_time_left_on_a_terminal_only() -> None:
    shown = Terminal()
    progress = Progress("farmer", 1_000, shown)
    progress._start -= 2.0
    progress._rows = 500
    assert progress.line(progress._start + 2.0) == (
        "import farmer: 500 rows of 1,000, 250 rows/s, 2 s left"
    )
    quiet = io.StringIO()
    Progress("farmer", 1_000, quiet).done()
    assert quiet.getvalue() == ""
