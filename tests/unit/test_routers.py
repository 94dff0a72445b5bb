"""The routers over key groups (``shared.stores.groups``): each forwards every operation
of the port it serves that names a type first, to the group that holds that type, and
writes only what spans every group. The list of operations is the port's own: a new one
is routed without touching the router, and one that names no type must be written."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from shared.domain.ports import HotPool, LedgerWrites, Nudges
from shared.stores.groups import HotRouter, LedgerRouter, WakeRouter, routed_operations

ROUTERS = [(HotRouter, HotPool), (WakeRouter, Nudges), (LedgerRouter, LedgerWrites)]
WHERE = {"national_id": "ns-a", "vid": "ns-b"}  # type -> its key group


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


def test_the_routed_operations_are_the_ports_own_that_name_a_type_first() -> None:
    assert routed_operations(HotPool) == ("pop", "pop_coalesced", "pop_once", "depth", "exhausted")
    assert routed_operations(Nudges) == ("nudge",)
    assert "backlog" in routed_operations(LedgerWrites)
    assert "refuse_eviction" not in routed_operations(HotPool)  # names no type


@pytest.mark.parametrize(("cls", "port"), ROUTERS, ids=lambda c: c.__name__)
async def test_each_operation_reaches_only_the_group_that_holds_the_type(
    cls: type, port: type
) -> None:
    for op in routed_operations(port):
        router, ports = _router(cls)
        answer = await getattr(router, op)("vid", 3, flag=True)
        assert answer == f"{op} answered"
        assert ports["ns-b"].calls == [(op, ("vid", 3), {"flag": True})]
        assert ports["ns-a"].calls == []


@pytest.mark.parametrize(("cls", "port"), ROUTERS, ids=lambda c: c.__name__)
def test_every_operation_of_the_port_is_implemented(cls: type, port: type) -> None:
    """An operation that names no type is not forwarded: the router must write it (the
    Protocol's empty body would otherwise answer None)."""
    for op, member in vars(port).items():
        if inspect.iscoroutinefunction(member) and not op.startswith("_"):
            assert getattr(cls, op) is not member, f"{cls.__name__}.{op} is the port's stub"


class _Stream:
    def __init__(self, length: int) -> None:
        self.length = length

    async def backlog(self, name: str = "") -> int:
        return self.length if name == "" else -1  # the whole stream, not one type's


async def test_the_ledger_router_totals_every_groups_backlog() -> None:
    streams: dict[str, Any] = {"ns-a": _Stream(4), "ns-b": _Stream(5)}
    router = LedgerRouter.over(streams, _Groups())  # type: ignore[arg-type]
    assert await router.total_backlog() == 9
