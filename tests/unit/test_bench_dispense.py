"""Reading wrk's report; the bench's pass/fail arithmetic."""

from __future__ import annotations

import logging
import shutil

import pytest

from keydispenser_ops.bench import dispense
from keydispenser_ops.bench.dispense import LoadGenerator, parse_wrk

WRK = """Running 3s test @ http://127.0.0.1:18080/v1/idgenerator/kd_bench/id
  1 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.60ms  437.00us   8.12ms   85.12%
    Req/Sec    20.12k     1.20k   22.00k    70.00%
  Latency Distribution
     50%  780.00us
     75%    1.71ms
     90%    2.02ms
     99%    1.20s
  60360 requests in 3.00s, 14.68MB read
  Non-2xx or 3xx responses: 12
Requests/sec:  20118.52
Transfer/sec:      4.89MB
"""


def test_wrk_report_is_read_in_milliseconds() -> None:
    got = parse_wrk(WRK)
    assert got == {
        "rps": 20118.52,
        "p50_ms": pytest.approx(0.78),
        "p99_ms": 1200.0,
        "requests": 60360.0,
        "non_2xx": 12.0,
    }


def test_a_report_without_figures_is_an_error() -> None:
    with pytest.raises(ValueError, match="wrk"):
        parse_wrk("unable to connect to 127.0.0.1:1 Connection refused")


def test_auto_says_when_it_falls_back_to_the_bundled_client(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Once, at the first run: a bench that cannot reach its servers fails in one line."""
    monkeypatch.setattr("shutil.which", lambda name: None)
    with caplog.at_level(logging.WARNING, logger=dispense.__name__):
        load = dispense.LoadGenerator(1.0, "auto")
        assert caplog.records == []
        load.announce()
        load.announce()
    assert load.name == "bundled-asyncio-client"
    assert [r.getMessage() for r in caplog.records] == ["bench_load_generator_fallback"]


def test_a_run_lasts_what_the_load_generator_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rates are divided by the time the load ran: wrk runs whole seconds, at least one."""
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    assert LoadGenerator(1.4, "wrk").duration == 1.0
    assert LoadGenerator(0.3, "wrk").duration == 1.0
    assert LoadGenerator(2.6, "wrk").duration == 3.0
    assert LoadGenerator(0.3, "bundled").duration == 0.3


async def test_each_measure_is_the_best_of_its_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--rounds N``: the load runs N times and the round with most requests/s is kept."""
    measured = iter([100.0, 300.0, 200.0])
    calls: list[str] = []

    async def bundled(self: LoadGenerator, url: str, headers: dict[str, str]) -> dict[str, float]:
        calls.append(url)
        rps = next(measured)
        return {"rps": rps, "p50_ms": 1.0, "p99_ms": 1000 / rps, "requests": rps, "non_2xx": 0}

    monkeypatch.setattr(LoadGenerator, "_bundled", bundled)
    load = LoadGenerator(1.0, "bundled", rounds=3)
    best = await load.run("http://127.0.0.1:1/x")
    assert len(calls) == 3
    assert best["rps"] == 300.0 and best["p99_ms"] == pytest.approx(1000 / 300)
