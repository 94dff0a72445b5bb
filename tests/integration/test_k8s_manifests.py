"""deploy/k8s: every overlay renders, every manifest validates against a pinned
Kubernetes schema, the pods are locked down, and every metric the alerts and the
dashboard name is one the code exports."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from dispenser.metrics import DispenserMetrics
from keygen.metrics import KeygenMetrics
from keysync.metrics import KeysyncMetrics
from shared.metrics import Heartbeat

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
OPERATIONS = K8S.parents[1] / "docs" / "operations.md"
KUBERNETES_VERSION = "1.31.0"  # the schema every manifest is checked against
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule"}  # CRDs: no schema bundled
KUSTOMIZATIONS = sorted(  # what `kubectl apply -k` takes (components are parts of them)
    p.parent
    for p in K8S.rglob("kustomization.yaml")
    if yaml.safe_load(p.read_text())["kind"] == "Kustomization"
)
MONITORING = K8S / "components" / "monitoring"
Doc = dict[str, Any]


def render(directory: Path) -> list[Doc]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        assert not os.environ.get("KD_TEST_REQUIRE_KUBECTL"), "kubectl is required here"
        pytest.skip("kubectl is not installed (.ci/run installs it)")
    out = subprocess.run(
        [kubectl, "kustomize", str(directory)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def source_documents() -> Iterator[tuple[Path, Doc]]:
    for path in sorted(K8S.rglob("*.yaml")):
        if path.name == "kustomization.yaml" or "config-" in path.name:
            continue  # kustomize's own file and strategic-merge patches
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path, doc


def pod_spec(doc: Doc) -> Doc | None:
    spec = doc.get("spec", {})
    if doc["kind"] in {"Deployment", "StatefulSet", "Job"}:
        pod: Doc = spec["template"]["spec"]
        return pod
    return None


def test_monitoring_overlays_carry_rules_monitor_and_dashboard() -> None:
    for overlay in ("monitoring", "production"):
        kinds = {(d["kind"], d["metadata"]["name"]) for d in render(K8S / "overlays" / overlay)}
        assert ("ServiceMonitor", "keydispenser") in kinds
        assert ("PrometheusRule", "keydispenser") in kinds
        assert ("ConfigMap", "keydispenser-dashboard") in kinds


def test_every_overlay_is_found() -> None:
    names = {p.name for p in KUSTOMIZATIONS}
    assert {"base", "ha-redis", "monitoring", "production", "redis-cluster"} <= names


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda p: p.name)
def test_overlay_renders_and_validates(directory: Path) -> None:
    docs = render(directory)
    assert docs
    for doc in docs:
        if doc["kind"] not in CUSTOM_KINDS:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_every_source_manifest_validates() -> None:
    for path, doc in source_documents():
        if doc["kind"] not in CUSTOM_KINDS:
            try:
                kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{path.relative_to(K8S)}: {exc.message}")


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda p: p.name)
def test_pods_are_restricted_and_bounded(directory: Path) -> None:
    for doc in render(directory):
        pod = pod_spec(doc)
        if pod is None:
            continue
        where = doc["metadata"]["name"]
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
        for container in pod["containers"] + pod.get("initContainers", []):
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            limits = container["resources"]
            assert {"cpu", "memory"} <= set(limits["requests"]), where
            assert {"cpu", "memory"} <= set(limits["limits"]), where
            if doc["kind"] != "Job":
                assert "livenessProbe" in container and "readinessProbe" in container, where


def secrets_seen(doc: Doc) -> set[str]:
    pod = pod_spec(doc) or {}
    names: set[str] = set()
    for container in pod.get("containers", []):
        for env in container.get("env", []):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                names.add(ref["name"])
        names |= {e["secretRef"]["name"] for e in container.get("envFrom", []) if "secretRef" in e}
    names |= {v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}
    return names


def test_each_secret_reaches_only_the_processes_that_use_it() -> None:
    docs = [d for d in render(K8S / "base") if pod_spec(d) is not None]
    seen = {d["metadata"]["name"]: secrets_seen(d) for d in docs}
    assert seen["keydispenser-dispenser"] == {"keydispenser-postgres", "keydispenser-api-keys"}
    assert seen["keydispenser-keysync"] == {"keydispenser-postgres"}
    assert seen["keydispenser-keygen"] == {"keydispenser-postgres", "keydispenser-permutation"}
    assert seen["keydispenser-migrate"] == {"keydispenser-postgres", "keydispenser-permutation"}


def test_keygen_and_keysync_probe_their_metrics_port() -> None:
    for doc in render(K8S / "base"):
        name = doc["metadata"]["name"]
        if doc["kind"] == "Deployment" and name in {"keydispenser-keygen", "keydispenser-keysync"}:
            (container,) = doc["spec"]["template"]["spec"]["containers"]
            assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
            assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
            env = {e["name"]: e.get("value") for e in container["env"]}
            tier = doc["metadata"]["labels"]["tier"].upper()
            assert env[f"KD_{tier}__METRICS_HOST"] == "0.0.0.0"


@pytest.mark.parametrize("overlay", ["ha-redis", "production"])
def test_ha_redis_wires_sentinel_and_refuses_eviction(overlay: str) -> None:
    docs = render(K8S / "overlays" / overlay)
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    config = yaml.safe_load(
        by_kind[("ConfigMap", "keydispenser-config")]["data"]["keydispenser.yaml"]
    )
    sentinels = config["redis_sentinel"]["sentinels"]
    assert len(sentinels) == 3
    assert by_kind[("StatefulSet", "redis-sentinel")]["spec"]["replicas"] == 3
    assert by_kind[("StatefulSet", "redis")]["spec"]["replicas"] >= 2
    script = by_kind[("ConfigMap", "redis-scripts")]["data"]["redis.sh"]
    assert "--maxmemory-policy noeviction" in script
    # The ledger stream survives a restart; a primary cut off from its replicas stops
    # taking writes; no DEBUG RELOAD of an older file in place (docs/reliability.md).
    for flag in (
        "--appendonly yes",
        "--appendfsync everysec",
        "--min-replicas-to-write 1",
        "--enable-debug-command no",
    ):
        assert flag in script, flag
    claims = by_kind[("StatefulSet", "redis")]["spec"]["volumeClaimTemplates"]
    assert [c["metadata"]["name"] for c in claims] == ["data"]
    service = "redis-sentinel-headless"
    assert all(s.split(":")[0].endswith("." + service) for s in sentinels)


def test_redis_cluster_wires_every_node_and_refuses_eviction() -> None:
    """The ConfigMap names every node of the StatefulSet; the nodes run cluster mode,
    announce names that survive a restart, keep the ledger stream (AOF), stop writing
    when cut off from their replica, refuse DEBUG and eviction; a Job creates the
    cluster with a replica per primary."""
    docs = render(K8S / "overlays" / "redis-cluster")
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    config = yaml.safe_load(
        by_kind[("ConfigMap", "keydispenser-config")]["data"]["keydispenser.yaml"]
    )
    servers = by_kind[("StatefulSet", "redis-cluster")]
    service = servers["spec"]["serviceName"]
    expected = [f"redis-cluster-{i}.{service}:6379" for i in range(servers["spec"]["replicas"])]
    assert config["redis_cluster"]["nodes"] == expected and "redis_sentinel" not in config
    scripts = by_kind[("ConfigMap", "redis-cluster-scripts")]["data"]
    for flag in (
        "--cluster-enabled yes",
        "--cluster-preferred-endpoint-type hostname",
        "--appendonly yes",
        "--min-replicas-to-write 1",
        "--enable-debug-command no",
        "--maxmemory-policy noeviction",
        # A shard without a primary must not stop the others (types spread over them).
        "--cluster-require-full-coverage no",
    ):
        assert flag in scripts["redis.sh"], flag
    assert "--cluster-replicas 1" in scripts["bootstrap.sh"]
    job = by_kind[("Job", "redis-cluster-bootstrap")]
    assert job["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"] == (
        "redis-cluster-scripts"
    )
    policy = by_kind[("NetworkPolicy", "redis-cluster")]
    ports = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert ports == {6379, 16379}
    # The settings the overlay gives load, naming the cluster.
    from shared.domain.config import ClusterConfig

    cluster = ClusterConfig.model_validate(config["redis_cluster"])
    assert cluster.nodes == tuple(expected) and cluster.slot_per == "type"


def test_only_keydispenser_reaches_the_stores() -> None:
    policies = [d for d in render(K8S / "overlays" / "ha-redis") if d["kind"] == "NetworkPolicy"]
    assert policies
    for policy in policies:
        for rule in policy["spec"]["ingress"]:
            allowed = [p["podSelector"]["matchLabels"]["app"] for p in rule["from"]]
            assert set(allowed) <= {"keydispenser", "redis"}


def exported_names() -> set[str]:
    """Every series name the code's registries can produce (counters as ``_total``)."""
    families: list[Metric] = []
    for make in (KeygenMetrics, KeysyncMetrics, DispenserMetrics, Heartbeat):
        reg = CollectorRegistry()
        make(reg)
        families += list(reg.collect())
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
    return {f.name + s for f in families for s in suffixes.get(f.type, [""])}


def monitoring_expressions() -> list[tuple[str, str]]:
    rules = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    exprs = [(r["alert"], r["expr"]) for g in rules["spec"]["groups"] for r in g["rules"]]
    dashboard = json.loads((MONITORING / "dashboard.json").read_text())
    for panel in dashboard["panels"]:
        exprs += [(panel["title"], t["expr"]) for t in panel["targets"]]
    return exprs


def test_alerts_and_dashboard_name_only_exported_metrics() -> None:
    exported = exported_names()
    for where, expr in monitoring_expressions():
        for name in re.findall(r"\bkd_[a-z0-9_]+", expr):
            assert name in exported, f"{where}: {name} is not exported"


def test_the_cross_check_catches_a_counter_without_total() -> None:
    assert "kd_keys_issued_total" in exported_names()
    assert "kd_keys_issued" not in exported_names()


def test_every_alert_has_a_runbook_section() -> None:
    rules = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    headings = {
        re.sub(r"[^a-z0-9-]", "", line.lstrip("#").strip().lower().replace(" ", "-"))
        for line in OPERATIONS.read_text().splitlines()
        if line.startswith("#")
    }
    wanted = {
        "headroom", "exhaustion", "hotdepth", "idg001", "keysync", "keygen",
        "redisfence", "postgresfence", "ledgerduplicates", "ledgerbacklog", "redisprimary",
    }  # fmt: skip
    alerts = [r for g in rules["spec"]["groups"] for r in g["rules"]]
    names = " ".join(r["alert"].lower() for r in alerts)
    assert all(w in names for w in wanted), wanted
    for rule in alerts:
        url = rule["annotations"]["runbook_url"]
        assert url.startswith("docs/operations.md#")
        assert url.split("#", 1)[1] in headings, rule["alert"]
