"""A TCP proxy on loopback for fault drills: one link from a process to a server that
can be cut while the server stays up for everyone else (a partition), or made to lose
the answers to one kind of request (an ambiguous failure).

Each ``Proxy`` listens on its own loopback port and forwards every connection to its
target. Modes (``Proxy.set``):

- ``pass``: forward both ways;
- ``cut``: a partition: established connections stay open and nothing crosses them
  either way, and new ones are accepted (the kernel does) but never answered, as with
  a host that packets no longer reach;
- ``reset``: every connection is closed at once and new ones are closed on accept
  (a peer that went away);
- ``lose_large_replies``: requests cross; a connection that sends a request larger
  than ``large_bytes`` is closed right after forwarding it, before any answer: the
  request ran, the client cannot know (an ambiguous failure of, say, a push).

It runs on its own thread and event loop, so sync and async callers alike can flip it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable
from typing import Any

log = logging.getLogger(__name__)
MODES = ("pass", "cut", "reset", "lose_large_replies")
_CHUNK = 65_536


class Proxy:
    def __init__(self, target_host: str, target_port: int, *, large_bytes: int = 4_096) -> None:
        self.target = (target_host, target_port)
        self.large_bytes = large_bytes
        self.mode = "pass"
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._call(self._listen())

    def _call(self, coroutine: Awaitable[Any]) -> Any:
        async def wrapped() -> Any:
            return await coroutine

        return asyncio.run_coroutine_threadsafe(wrapped(), self._loop).result(10)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accepted, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    def set(self, mode: str) -> None:
        """Switch every connection, open or new, to ``mode`` (MODES)."""
        if mode not in MODES:
            raise ValueError(f"proxy mode {mode!r}: one of {MODES}")
        self._call(self._switch(mode))

    async def _switch(self, mode: str) -> None:
        self.mode = mode
        if mode == "reset":
            for link in list(self._links):
                link.close()

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "reset":
            writer.close()
            return
        try:
            upstream = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        link = _Link(self, (reader, writer), upstream)
        self._links.add(link)
        try:
            await link.run()
        finally:
            self._links.discard(link)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.close()


class _Link:
    """One client connection and its connection to the target."""

    def __init__(
        self,
        proxy: Proxy,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        server: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self._proxy = proxy
        self._client = client
        self._server = server
        self._muted = False  # a large request crossed: its answer (and all after) is lost

    async def run(self) -> None:
        up = asyncio.ensure_future(self._pump(self._client[0], self._server[1], upstream=True))
        down = asyncio.ensure_future(self._pump(self._server[0], self._client[1], upstream=False))
        await asyncio.wait([up, down], return_when=asyncio.FIRST_COMPLETED)
        for task in (up, down):
            task.cancel()
        self.close()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, upstream: bool
    ) -> None:
        while True:
            data = await reader.read(_CHUNK)
            if not data:
                return
            if self._proxy.mode == "cut" or (self._muted and not upstream):
                continue  # dropped on the floor: the sender never learns
            large = upstream and len(data) > self._proxy.large_bytes
            if large and self._proxy.mode == "lose_large_replies":
                self._muted = True
            writer.write(data)
            await writer.drain()
            if self._muted and upstream:
                await asyncio.sleep(0.2)  # the server runs it; its answer is lost
                return

    def close(self) -> None:
        for _, writer in (self._client, self._server):
            with contextlib.suppress(Exception):
                writer.close()
