"""dispenser.server: each server gets the configured limits in its own terms."""

from __future__ import annotations

import pytest

from dispenser.server import GRANIAN_MIN_HEAD_BYTES, granian_options, uvicorn_options
from shared.domain.config import DispenserConfig, load_settings
from shared.domain.errors import ConfigError
from tests.conftest import EMPTY_CONFIG

LIMITS = DispenserConfig(
    workers=3, limit_concurrency=77, timeout_keep_alive_s=7, max_header_bytes=20_000
)


def test_the_server_is_uvicorn_unless_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KD_PERMUTATION_KEY", "k")
    assert load_settings(EMPTY_CONFIG).dispenser.server == "uvicorn"
    monkeypatch.setenv("KD_DISPENSER__SERVER", "granian")
    assert load_settings(EMPTY_CONFIG).dispenser.server == "granian"
    monkeypatch.setenv("KD_DISPENSER__SERVER", "hypercorn")
    with pytest.raises(ConfigError, match=r"dispenser\.server"):
        load_settings(EMPTY_CONFIG)


def test_uvicorn_gets_the_limits() -> None:
    options = uvicorn_options(LIMITS)
    assert options["limit_concurrency"] == 77
    assert options["timeout_keep_alive"] == 7
    assert options["h11_max_incomplete_event_size"] == 20_000


def test_granian_gets_the_same_limits_in_its_terms() -> None:
    options = granian_options(LIMITS, "WARNING")
    assert options["workers"] == 3
    assert options["backpressure"] == 77  # per worker, as uvicorn's limit_concurrency
    http1 = options["http1_settings"]
    assert http1.header_read_timeout == 7_000  # milliseconds
    assert http1.max_buffer_size == 20_000
    assert options["interface"] == "rsgi"  # the app runs its ASGI lifespan in every worker
    assert options["workers_kill_timeout"] == uvicorn_options(LIMITS)["timeout_graceful_shutdown"]
    assert options["log_level"] == "warning"


def test_granian_head_bound_is_never_below_what_hyper_accepts() -> None:
    small = DispenserConfig(max_header_bytes=2_048)
    assert granian_options(small)["http1_settings"].max_buffer_size == GRANIAN_MIN_HEAD_BYTES


def test_uvicorns_httptools_protocol_still_has_what_the_head_bound_builds_on() -> None:
    """BoundedHttpTools subclasses a class uvicorn does not document: it overrides three
    of its callbacks and uses its ``config``, ``logger``, ``transport`` and
    ``send_400_response``. This fails, naming the missing part, when uvicorn changes them."""
    import inspect

    from uvicorn.config import HTTP_PROTOCOLS
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    assert HTTP_PROTOCOLS["httptools"].endswith(":HttpToolsProtocol")
    for name in ("data_received", "on_headers_complete", "on_message_complete"):
        assert callable(getattr(HttpToolsProtocol, name, None)), name
    assert list(inspect.signature(HttpToolsProtocol.send_400_response).parameters) == [
        "self",
        "msg",
    ]
    init = inspect.getsource(HttpToolsProtocol.__init__)
    for attribute in ("self.config", "self.logger", "self.transport"):
        assert attribute in init, attribute
