"""ScriptLine packs a command's head once and its arguments per call: the bytes must be
exactly what redis-py packs for the whole command (no server: packing is pure)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.connection import Connection

from shared.stores.redis.script_line import ScriptLine

Argument = str | int | bytes | float
SHA = "0123456789abcdef0123456789abcdef01234567"
texts = st.text(max_size=40)
arguments = st.lists(
    st.one_of(texts, st.integers(), st.binary(max_size=40), st.floats(allow_nan=False)),
    max_size=8,
)


@given(keys=st.lists(texts, max_size=8), args=arguments, again=arguments)
def test_a_packed_command_is_the_librarys_own(
    keys: list[str], args: list[Argument], again: list[Argument]
) -> None:
    connection = Connection()  # packs with its encoder; never connects here
    line = ScriptLine()
    for each in (args, again):  # the second call reuses the head packed by the first
        expected = b"".join(connection.pack_command("EVALSHA", SHA, len(keys), *keys, *each))
        assert line.command(connection, SHA, keys, each) == expected
