"""Metrics plumbing common to every process; each process defines its own metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, start_http_server

TYPE = ["id_type"]


def serve(registry: CollectorRegistry, host: str, port: int | None) -> None:
    """Expose ``registry`` over HTTP in a background thread when a port is set."""
    if port is not None:
        start_http_server(port, addr=host, registry=registry)
