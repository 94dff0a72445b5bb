"""The watch for a batch client's disconnect: it skips the ignored body, returns on a
disconnect, and never spins on a receive that answers at once forever."""

from __future__ import annotations

import asyncio

from starlette.types import Message

from dispenser.routes import disconnected


def replies(*messages: Message) -> object:
    queue = list(messages)

    async def receive() -> Message:
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return receive


async def test_a_disconnect_after_the_body_ends_the_watch() -> None:
    receive = replies(
        {"type": "http.request", "body": b"x", "more_body": True},
        {"type": "http.request", "body": b"", "more_body": False},
        {"type": "http.disconnect"},
    )
    await asyncio.wait_for(disconnected(receive), 1)  # type: ignore[arg-type]


async def test_a_receive_answering_at_once_forever_never_blocks_the_loop() -> None:
    receive = replies({"type": "http.request", "body": b"", "more_body": False})
    watch = asyncio.ensure_future(disconnected(receive))  # type: ignore[arg-type]
    ticks = 0
    for _ in range(50):  # the loop keeps turning: the watch does not spin
        await asyncio.sleep(0)
        ticks += 1
    assert ticks == 50 and not watch.done()
    watch.cancel()
