"""TCP proxies on loopback for fault drills: a link from one process to one server that
can be cut while the server stays up for everyone else (a partition), or made to lose
the answer to one kind of request (an ambiguous failure).

Each ``Proxy`` listens on its own loopback port and forwards every connection to its
target. Modes (``Proxy.set``):

- ``pass``: forward both ways;
- ``cut``: a partition: established connections stay open and nothing crosses them
  either way, and new ones are accepted (the kernel does) but never answered, as with
  a host that packets no longer reach; what was sent meanwhile is held, not lost, and
  crosses once the link is set back to ``pass`` (as TCP retransmits after a partition
  heals, if the peers have not given up on the connection by then);
- ``reset``: every connection is closed at once and new ones are closed on accept
  (a peer that went away);
- ``lose_large_replies``: requests cross; a connection that sends a request larger
  than ``large_bytes`` is closed right after forwarding it, before any answer: the
  request ran, the client cannot know (an ambiguous failure of, say, a push).

Proxies share one ``ProxyHub``: a process of its own (its own core and interpreter,
so a busy drill cannot starve the links and make faults of its own), running one event
loop, driven over a pipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

MODES = ("pass", "cut", "reset", "lose_large_replies")
_CHUNK = 65_536
_ANSWER_S = 10.0


class ProxyHub:
    """The process every proxy of a drill runs in."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child,), daemon=True)
        self._process.start()
        child.close()
        self._lock = threading.Lock()
        self.proxies: list[Proxy] = []

    def _ask(self, *request: Any) -> Any:
        with self._lock:
            self._conn.send(request)
            if not self._conn.poll(_ANSWER_S):
                raise RuntimeError(f"proxy hub did not answer {request[0]}")
            answer = self._conn.recv()
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def proxy(
        self, target_port: int, target_host: str = "127.0.0.1", large_bytes: int = 4_096
    ) -> Proxy:
        number, port = self._ask("open", target_host, target_port, large_bytes)
        found = Proxy(self, number, port, (target_host, target_port))
        self.proxies.append(found)
        return found

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._ask("quit")
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
        self._conn.close()


@dataclass
class Proxy:
    """A handle on one proxy of a hub."""

    hub: ProxyHub
    number: int
    port: int
    target: tuple[str, int]
    mode: str = "pass"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set(self, mode: str) -> None:
        """Switch every connection, open or new, to ``mode`` (MODES)."""
        if mode not in MODES:
            raise ValueError(f"proxy mode {mode!r}: one of {MODES}")
        self.hub._ask("set", self.number, mode)
        self.mode = mode

    def retarget(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        """Forward new connections to ``target_host:target_port``; close the open ones."""
        self.hub._ask("retarget", self.number, target_host, target_port)
        self.target = (target_host, target_port)


def standalone(target_host: str, target_port: int, large_bytes: int = 4_096) -> Proxy:
    """A proxy with a hub of its own (close it with ``proxy.hub.close()``)."""
    return ProxyHub().proxy(target_port, target_host, large_bytes)


# --- the hub's process ----------------------------------------------------------


def _serve(conn: Connection) -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    asyncio.run(_Hub(conn).run())


class _Hub:
    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._proxies: list[_Proxy] = []

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            request = await loop.run_in_executor(None, self._conn.recv)
            if request[0] == "quit":
                for proxy in self._proxies:
                    proxy.shutdown()
                self._conn.send(None)
                return
            try:
                answer = await self._handle(request)
            except Exception as exc:
                answer = exc
            self._conn.send(answer)

    async def _handle(self, request: tuple[Any, ...]) -> Any:
        if request[0] == "open":
            _, host, port, large_bytes = request
            proxy = _Proxy((host, port), large_bytes)
            await proxy.listen()
            self._proxies.append(proxy)
            return len(self._proxies) - 1, proxy.port
        if request[0] == "set":
            _, number, mode = request
            self._proxies[number].switch(mode)
            return None
        if request[0] == "retarget":
            _, number, host, port = request
            self._proxies[number].retarget((host, port))
            return None
        raise ValueError(f"unknown proxy hub request {request[0]!r}")


class _Proxy:
    def __init__(self, target: tuple[str, int], large_bytes: int) -> None:
        self.target = target
        self.large_bytes = large_bytes
        self.mode = "pass"
        self.port = 0
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._open = asyncio.Event()  # set while the link is not cut
        self._open.set()

    async def listen(self) -> None:
        self._server = await asyncio.start_server(self._accepted, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def crossable(self) -> None:
        """Wait while the link is cut."""
        await self._open.wait()

    def retarget(self, target: tuple[str, int]) -> None:
        self.target = target
        for link in list(self._links):
            link.close()

    def switch(self, mode: str) -> None:
        self.mode = mode
        if mode == "cut":
            self._open.clear()
        else:
            self._open.set()
        if mode == "reset":
            for link in list(self._links):
                link.close()

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "reset":
            writer.close()
            return
        await self.crossable()
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

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.close()


class _Link:
    """One client connection and its connection to the target."""

    def __init__(
        self,
        proxy: _Proxy,
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
        with contextlib.suppress(OSError):
            while True:
                data = await reader.read(_CHUNK)
                if not data:
                    return
                await self._proxy.crossable()  # held while the link is cut
                if self._muted and not upstream:
                    continue  # an answer lost on the way: the sender never learns
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
