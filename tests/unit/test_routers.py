"""The routers over key groups (``shared.stores.groups``): each writes out every operation
of the port it serves. One that names a type first (a routed operation) goes to the
group that holds that type, with every argument it was given; one that names no type
spans every group. A port operation added without its forwarder fails here, not as a
silent None from the Protocol's empty body."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from shared.domain.ports import HotPool, LedgerWrites, Nudges
from shared.stores.groups import HotRouter, LedgerRouter, WakeRouter
from shared.stores.hot.hot_store import HotStore
from shared.stores.hot.wake import WakeChannel
from shared.stores.ledger.stream import LedgerStream

# Each router, the port it serves, and the adapter it routes to.
ROUTERS = [
    (HotRouter, HotPool, HotStore),
    (WakeRouter, Nudges, WakeChannel),
    (LedgerRouter, LedgerWrites, LedgerStream),
]
WHERE = {"national_id": "ns-a", "vid": "ns-b"}  # type -> its key group


def routed_operations(port: type) -> tuple[str, ...]:
    """The operations of ``port`` (a Protocol) that take a type's name first."""
    return tuple(
        op
        for op, member in vars(port).items()
        if not op.startswith("_")
        and inspect.iscoroutinefunction(member)
        and list(inspect.signature(member).parameters)[1:2] == ["name"]
    )


def operations(port: type) -> tuple[str, ...]:
    """Every operation of ``port``."""
    return tuple(
        op
        for op, member in vars(port).items()
        if not op.startswith("_") and inspect.iscoroutinefunction(member)
    )


class _Settings:
    @staticmethod
    def key_namespace_of(name: str) -> str:
        return WHERE[name]


class _Groups:
    settings = _Settings()


class _Recorder:
    """A group's port that records every call made of it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, op: str) -> Any:
        async def call(*args: Any, **kwargs: Any) -> str:
            self.calls.append((op, args, kwargs))
            return f"{op} answered"

        return call


def _router(cls: type) -> tuple[Any, dict[str, _Recorder]]:
    ports = {namespace: _Recorder() for namespace in WHERE.values()}
    return cls(ports, _Groups()), ports


def _arguments(port_op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments of a call of ``port_op`` (self left out), by parameter name."""
    bound = inspect.signature(port_op).bind(None, *args, **kwargs)
    return {name: value for name, value in bound.arguments.items() if name != "self"}


def test_the_routed_operations_are_the_ports_own_that_name_a_type_first() -> None:
    """Control: the list the tests below walk is the ports' own."""
    assert routed_operations(HotPool) == (
        "pop",
        "pop_coalesced",
        "pop_once",
        "depth",
        "exhausted",
        "stock_epoch",
    )
    assert routed_operations(Nudges) == ("nudge",)
    assert "backlog" in routed_operations(LedgerWrites)
    assert "refuse_eviction" not in routed_operations(HotPool)  # names no type


@pytest.mark.parametrize(("cls", "port", "adapter"), ROUTERS, ids=lambda c: c.__name__)
def test_the_router_writes_every_routed_operation_of_its_port(
    cls: type, port: type, adapter: type
) -> None:
    """Written in the router's own body: not inherited from the port's empty stub, not
    added when the class is made."""
    source = inspect.getsource(cls)
    missing = [op for op in routed_operations(port) if f"async def {op}(" not in source]
    assert missing == [], f"{cls.__name__} lacks forwarders for {missing}"
    for op in operations(port):
        assert op in vars(cls), f"{cls.__name__}.{op} is the port's stub"


@pytest.mark.parametrize(("cls", "port", "adapter"), ROUTERS, ids=lambda c: c.__name__)
def test_each_forwarder_has_the_ports_signature(cls: type, port: type, adapter: type) -> None:
    """The same parameters, in order, of the same kinds; the defaults the port states,
    or the adapter's where the port leaves them to it (``...``)."""
    for op in routed_operations(port):
        written = inspect.signature(getattr(cls, op)).parameters
        stated = inspect.signature(getattr(port, op)).parameters
        concrete = inspect.signature(getattr(adapter, op)).parameters
        assert [(p.name, p.kind) for p in written.values()] == [
            (p.name, p.kind) for p in stated.values()
        ], f"{cls.__name__}.{op}"
        for name, parameter in stated.items():
            default = parameter.default
            expected = concrete[name].default if default is Ellipsis else default
            assert written[name].default == expected, f"{cls.__name__}.{op}({name})"


@pytest.mark.parametrize(("cls", "port", "adapter"), ROUTERS, ids=lambda c: c.__name__)
async def test_each_operation_reaches_only_the_group_that_holds_the_type_with_every_argument(
    cls: type, port: type, adapter: type
) -> None:
    for op in routed_operations(port):
        router, ports = _router(cls)
        params = list(inspect.signature(getattr(port, op)).parameters)[2:]
        given = {name: object() for name in params}  # one value of its own per argument
        answer = await getattr(router, op)("vid", **given)
        assert answer == f"{op} answered" or (answer is None and op == "nudge")
        [(called, args, kwargs)] = ports["ns-b"].calls
        assert called == op
        assert _arguments(getattr(port, op), args, kwargs) == {"name": "vid", **given}
        assert ports["ns-a"].calls == []


class _Stream:
    def __init__(self, length: int) -> None:
        self.length = length

    async def backlog(self, name: str = "") -> int:
        return self.length if name == "" else -1  # the whole stream, not one type's


async def test_the_ledger_router_totals_every_groups_backlog() -> None:
    streams: dict[str, Any] = {"ns-a": _Stream(4), "ns-b": _Stream(5)}
    router = LedgerRouter.over(streams, _Groups())  # type: ignore[arg-type]
    assert await router.total_backlog() == 9
