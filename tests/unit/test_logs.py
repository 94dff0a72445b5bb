"""JSON log lines, with levels per logger over the process's own (log_levels)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from shared import logs
from shared.domain.config import load_settings
from shared.domain.errors import ConfigError
from tests.conftest import EMPTY_CONFIG


@pytest.fixture
def restored() -> Iterator[None]:
    """Put the logging tree back as it was: configure() changes it process-wide."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    leasing = logging.getLogger("shared.leases.holder")
    leasing_level = leasing.level
    yield
    root.handlers[:], root.level = handlers, level
    leasing.setLevel(leasing_level)


def test_a_logger_of_its_own_level_logs_below_the_process_level(
    restored: None, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.configure("keysync", "INFO", {"shared.leases.holder": "DEBUG"})
    logging.getLogger("shared.leases.holder").debug("lease_renewed", extra={"machine_id": 7})
    logging.getLogger("shared.stores").debug("not_this_one")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [(line["event"], line["level"]) for line in lines] == [("lease_renewed", "debug")]
    assert lines[0]["machine_id"] == 7 and lines[0]["process"] == "keysync"


def test_without_levels_of_their_own_renewals_are_not_logged(
    restored: None, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.configure("dispenser", "INFO")
    logging.getLogger("shared.leases.holder").debug("lease_renewed")
    logging.getLogger("shared.leases.holder").info("lease_granted")
    events = [json.loads(line)["event"] for line in capsys.readouterr().err.splitlines()]
    assert events == ["lease_granted"]


def test_an_unknown_level_is_refused_naming_the_logger() -> None:
    with pytest.raises(ConfigError, match=r"log_levels\.shared\.leases\.holder"):
        load_settings(EMPTY_CONFIG, log_levels={"shared.leases.holder": "LOUD"})


@pytest.mark.parametrize("formatter", [logs.JsonFormatter, logs.ConsoleFormatter])
def test_uvicorns_colour_copy_of_its_message_is_no_field(
    formatter: type[logging.Formatter],
) -> None:
    """uvicorn logs ``color_message`` beside its message: ANSI codes, never a field."""
    record = logging.LogRecord("uvicorn.error", logging.INFO, "", 0, "Started %s", ("x",), None)
    record.color_message = "Started \x1b[1m%s\x1b[0m"
    record.port = 8080
    line = formatter("dispenser").format(record)
    assert "\x1b" not in line and "color_message" not in line and "8080" in line
