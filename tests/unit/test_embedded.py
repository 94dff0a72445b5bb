"""The command line of the embedded and drill Redis servers."""

from __future__ import annotations

from pathlib import Path

from keydispenser_ops.embedded import redis_server_command


def flags(argv: list[str]) -> dict[str, str]:
    pairs = argv[1:]
    return dict(zip(pairs[::2], pairs[1::2], strict=True))


def test_a_server_is_loopback_only_and_keeps_nothing_on_disk() -> None:
    got = flags(redis_server_command(6390, Path("/data/r")))
    assert got == {
        "--bind": "127.0.0.1",
        "--port": "6390",
        "--save": "",
        "--appendonly": "no",
        "--dir": "/data/r",
        "--logfile": "/data/r/server.log",
    }


def test_options_come_last() -> None:
    argv = redis_server_command(6390, Path("/d"), "--replicaof", "127.0.0.1", "6391")
    assert argv[-3:] == ["--replicaof", "127.0.0.1", "6391"]
