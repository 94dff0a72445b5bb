"""`bench keysync` and `bench client` run end to end; their figures are reported, never
asserted. What is asserted is what they count: every key moved or taken, exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from keydispenser_ops.processes import run_cli
from shared.domain import redis_keys
from shared.domain.apikeys import new_api_key
from shared.domain.config import ApiKeyConfig, AuthConfig, Settings
from tests.acceptance.harness import process_env, write_config
from tests.conftest import NS

pytestmark = [pytest.mark.acceptance, pytest.mark.not_pooled]


def test_bench_keysync_moves_every_key_exactly_in_one_and_two_processes(
    settings: Settings, tmp_path: Path
) -> None:
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    out = tmp_path / "keysync.json"
    result = run_cli(
        "bench", "keysync", "--seconds", "0.05", "--processes", "1", "2", "--json", str(out),
        env=env, timeout_s=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    for processes in (1, 2):
        measure = report[f"processes_{processes}"]
        assert measure["exact"] is True
        assert measure["keys_moved"] == report["keys_per_measure"] == 20_000
        assert len(measure["per_process_moved"]) == processes
        assert measure["keys_per_s"] > 0
    # It leaves its scratch Redis database as it found it: a next run is not refused.
    client = redis.Redis.from_url(settings.redis_url)
    try:
        assert not client.exists(redis_keys.sync_record_key(NS), redis_keys.hot_registry_key(NS))
    finally:
        client.close()


def test_the_benches_refuse_a_redis_database_holding_state_and_leave_it(
    settings: Settings, tmp_path: Path
) -> None:
    """A database holding keydispenser state (here: the sync record ``fill`` wrote) is
    refused, and left exactly as it was: a refused bench tidies nothing up."""
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    assert run_cli("migrate", env=env).returncode == 0
    assert run_cli("fill", "--type", "farmer", "--count", "1", env=env).returncode == 0
    client = redis.Redis.from_url(settings.redis_url)
    try:
        record = client.hgetall(redis_keys.sync_record_key(NS))
        assert record
        for bench in ("keysync", "pipeline", "client"):
            refused = run_cli("bench", bench, "--seconds", "0.05", env=env, timeout_s=120)
            assert refused.returncode == 2, (bench, refused.stderr[-2000:])
            assert "scratch database" in refused.stderr
            assert client.hgetall(redis_keys.sync_record_key(NS)) == record, bench
    finally:
        client.close()


def test_every_bench_leaves_its_scratch_redis_database_as_found(
    settings: Settings, tmp_path: Path
) -> None:
    """``bench dispense`` runs a whole dispenser (fence, sync record, hot registry); the
    next bench on the same ``redis_url`` is not refused, and neither leaves a key."""
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    client = redis.Redis.from_url(settings.redis_url)
    try:
        client.set(f"{NS}:operator-note", "kept")  # what was there stays
        before = set(client.scan_iter(match=f"{NS}:*"))
        dispense = run_cli(
            "bench", "dispense", "--seconds", "1", "--load", "bundled", "--servers", "uvicorn",
            env=env, timeout_s=300,
        )  # fmt: skip
        assert dispense.returncode == 0, dispense.stderr[-3000:]
        assert set(client.scan_iter(match=f"{NS}:*")) == before
        keysync = run_cli(
            "bench", "keysync", "--seconds", "0.05", "--processes", "1", env=env, timeout_s=300
        )
        assert keysync.returncode == 0, keysync.stderr[-3000:]
        assert set(client.scan_iter(match=f"{NS}:*")) == before
    finally:
        client.close()


def test_bench_client_takes_keys_through_the_client(settings: Settings, tmp_path: Path) -> None:
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    out = tmp_path / "client.json"
    result = run_cli(
        "bench", "client", "--seconds", "0.2", "--json", str(out), env=env, timeout_s=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["keys_taken"] > 0 and report["async_keys_taken"] > 0
    assert isinstance(report["targets_met"], bool)  # reported; depends on speed


def test_bench_pipeline_runs_the_three_processes_and_counts_every_key(
    settings: Settings, tmp_path: Path
) -> None:
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    out = tmp_path / "pipeline.json"
    result = run_cli(
        "bench", "pipeline", "--seconds", "0.2", "--json", str(out), env=env, timeout_s=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["keys_dispensed"] > 0 and report["other_errors"] == 0
    assert report["keys_dispensed"] % report["batch"] == 0 or report["hot_ran_dry"]
    assert isinstance(report["hot_ran_dry"], bool)  # reported; depends on speed
    for rate in ("keys_per_s", "offered_keys_per_s", "keygen_keys_per_s", "keysync_keys_per_s"):
        assert report[rate] >= 0
    assert report["rate_keys_per_s"] == 200_000  # the default offered load
    assert report["requests"] <= 0.2 * 200_000 / report["batch"]  # paced, not full speed
    assert report["hot_depth_samples"] > 0


def test_bench_pipeline_runs_on_a_redis_cluster_of_its_own(
    settings: Settings, tmp_path: Path
) -> None:
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    out = tmp_path / "pipeline-cluster.json"
    result = run_cli(
        "bench",
        "pipeline",
        "--seconds",
        "0.2",
        "--redis-cluster",
        "1",
        "--json",
        str(out),
        env=env,
        timeout_s=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["redis"].startswith("cluster of 1 primaries")
    assert report["keys_dispensed"] > 0 and report["other_errors"] == 0
    refused = run_cli("bench", "keysync", "--redis-cluster", "1", env=env, timeout_s=60)
    # Each benchmark has its own options: keysync's has no --redis-cluster.
    assert refused.returncode == 2 and "unrecognized arguments: --redis-cluster" in refused.stderr


def test_bench_pipeline_spreads_types_over_a_clusters_shards(
    settings: Settings, tmp_path: Path
) -> None:
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    out = tmp_path / "pipeline-spread.json"
    result = run_cli(
        "bench",
        "pipeline",
        "--seconds",
        "0.3",
        "--redis-cluster",
        "3",
        "--slot-per",
        "type",
        "--types",
        "3",
        "--json",
        str(out),
        env=env,
        timeout_s=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["redis"].endswith("slot_per type") and report["id_types"] == 3
    types = report["types"]
    assert len({each["key_namespace"] for each in types.values()}) == 3
    assert all(each["keys_per_s"] > 0 for each in types.values()), types
    assert report["other_errors"] == 0
    refused = run_cli("bench", "pipeline", "--slot-per", "type", env=env, timeout_s=60)
    assert refused.returncode != 0 and "--slot-per: with --redis-cluster only" in refused.stderr


def test_bench_fastpath_answers_every_request_in_process(
    settings: Settings, tmp_path: Path
) -> None:
    # The configuration's API keys do not apply to the bench's own calls.
    _, hashed = new_api_key()
    auth = AuthConfig(api_keys=(ApiKeyConfig(name="registry", sha256=hashed),))
    settings = settings.model_copy(
        update={"dispenser": settings.dispenser.model_copy(update={"auth": auth})}
    )
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    out = tmp_path / "fastpath.json"
    result = run_cli(
        "bench", "fastpath", "--seconds", "1", "--json", str(out), env=env, timeout_s=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["requests"] > 0 and report["non_200"] == 0  # the single-ID route, answered
    assert report["keys_per_pop"] >= 1  # keys taken by one coalesced pop
    assert report["cpu_us_per_request"] > 0 and report["wall_us_per_request"] > 0
    # It removes the list it filled, and the list's entry in the fence's registry.
    client = redis.Redis.from_url(settings.redis_url)
    try:
        hot_list = redis_keys.hot_list_key(NS, "kd_bench")
        assert not client.exists(hot_list)
        assert not client.sismember(redis_keys.hot_registry_key(NS), hot_list)
    finally:
        client.close()


@pytest.mark.parametrize("seconds", ["0.5", "61"])
def test_bench_fastpath_refuses_a_duration_out_of_bounds(
    settings: Settings, tmp_path: Path, seconds: str
) -> None:
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    refused = run_cli("bench", "fastpath", "--seconds", seconds, env=env, timeout_s=120)
    assert refused.returncode == 2
    assert "--seconds" in refused.stderr


def test_the_growth_benches_measure_on_a_registry_they_load(
    settings: Settings, tmp_path: Path
) -> None:
    """`bench ledger` and `bench lifecycle` at their smallest: the registry is loaded,
    every request answered, the status and readiness timed (figures never asserted)."""
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    out = tmp_path / "ledger.json"
    ledger = run_cli(
        "bench", "ledger", "--seconds", "0.05", "--processes", "1", "--rate", "2000",
        "--existing-rows", "3000", "--json", str(out), env=env, timeout_s=300,
    )  # fmt: skip
    assert ledger.returncode == 0, ledger.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["load"]["rows"] == 3000
    assert report["keysyncs_1"]["drain"]["keys_applied"] == 2000  # every key, in the measure
    assert report["after_checkpoint"]["keys_applied"] == 2000
    out = tmp_path / "lifecycle.json"
    lifecycle = run_cli(
        "bench", "lifecycle", "--seconds", "2", "--rate", "5", "--existing-rows", "3000",
        "--json", str(out), env=env, timeout_s=300,
    )  # fmt: skip
    assert lifecycle.returncode == 0, lifecycle.stderr[-3000:]
    report = json.loads(out.read_text())
    failed = [line for line in lifecycle.stderr.splitlines() if "request_failed" in line]
    assert report["errors"] == {} and report["shed"] == 0, failed
    assert report["put_uin"]["count"] == report["sent"]["put"] >= 9
    assert report["lookup"]["count"] == report["sent"]["lookup"] >= 90
    assert report["status_s"] > 0 and report["readyz_ms"] > 0
    client = redis.Redis.from_url(settings.redis_url)
    try:
        assert not client.exists(redis_keys.sync_record_key(NS))  # left as found
    finally:
        client.close()


def test_bench_keygen_deep_into_the_keyspace_reports_its_headroom(
    settings: Settings, tmp_path: Path
) -> None:
    env = process_env(settings, write_config(settings, tmp_path / "c.yaml"))
    out = tmp_path / "keygen.json"
    result = run_cli(
        "bench", "keygen", "--seconds", "0.05", "--spent", "0.9", "--json", str(out),
        env=env, timeout_s=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    for name in ("numeric10", "base62_7"):
        assert report[f"{name}_stored_per_s"] > 0
        assert 0.0 < report[f"{name}_headroom"]["fraction_left"] <= 0.1
