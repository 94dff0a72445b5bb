"""deploy/helm/keydispenser, rendered by Helm's own engine (its Go SDK, offline) over
several value sets: every object validates against a pinned Kubernetes schema, the
pods are locked down, each Secret reaches only the processes that use it, no Secret
is ever rendered without its value, migrate is a hook, the configuration loads, and
every metric the alerts and the dashboard name is one the code exports."""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from dispenser.metrics import DispenserMetrics
from keygen.metrics import KeygenMetrics
from keysync.metrics import KeysyncMetrics
from shared.domain.config.loader import load_settings
from shared.metrics import Heartbeat

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "keydispenser"
OPERATIONS = CHART.parents[2] / "docs" / "operations.md"
KUBERNETES_VERSION = "1.31.0"  # the schema every object is checked against
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule", "VirtualService", "Gateway"}  # CRDs
PROCESSES = ("migrate", "keygen", "keysync", "dispenser")
RELEASE, NAMESPACE = "ids", "registry"
FULLNAME = f"{RELEASE}-keydispenser"
Doc = dict[str, Any]

# Secrets an operator created with kubectl first (deploy/README.md).
NAMED = {
    "permutationKey": {"existingSecret": "kd-permutation"},
    "postgres": {"existingSecret": "kd-postgres"},
}
SENTINELS = [f"redis-sentinel-{i}.redis-sentinel-headless:26379" for i in range(3)]
NODES = [f"redis-cluster-{i}.redis-cluster-headless:6379" for i in range(6)]
DSNS = {p: f"postgresql://kd_{p}:pw-{p}@pg-0:5432,pg-1:5432/keydispenser" for p in PROCESSES}
ALL_ON = {kind: {"enabled": True} for kind in ("serviceMonitor", "prometheusRule", "dashboard")}
TYPES = {
    "farmer": {"kind": "numeric", "length": 10, "filter_profile": "openg2p"},
    "shortlink": {"kind": "base62", "length": 7},
}
VALUE_SETS: dict[str, Doc] = {
    # Bring your own PostgreSQL and one Redis server; Secrets named.
    "defaults": {"config": {"id_types": TYPES}, "secrets": NAMED},
    # Your own Redis behind Sentinel, with passwords.
    "sentinel": {
        "config": {
            "id_types": TYPES,
            "redis_sentinel": {"sentinels": SENTINELS, "master_name": "mymaster"},
        },
        "secrets": {
            **NAMED,
            "redis": {
                "existingSecret": "kd-redis",
                "passwordKey": "password",
                "sentinelPasswordKey": "sentinel-password",
            },
        },
    },
    # Your own Redis Cluster.
    "cluster": {
        "config": {"id_types": TYPES, "redis_cluster": {"nodes": NODES, "slot_per": "type"}},
        "secrets": {**NAMED, "redis": {"existingSecret": "kd-redis", "passwordKey": "password"}},
    },
    # The optional dependency charts: their addresses and Secrets wired in.
    "bitnami-sentinel": {
        "config": {"id_types": TYPES},
        "secrets": NAMED,
        "redis": {"enabled": True},
    },
    "bitnami-cluster": {
        "config": {"id_types": TYPES},
        "secrets": NAMED,
        "redis-cluster": {"enabled": True},
    },
    # Monitoring, Istio (with a Gateway), every tier autoscaled, API keys.
    "monitoring-istio": {
        "config": {"id_types": TYPES},
        "secrets": {**NAMED, "apiKeys": {"existingSecret": "kd-api-keys"}},
        "monitoring": ALL_ON,
        "istio": {
            "enabled": True,
            "hostname": "ids.example.org",
            "gateway": {
                "enabled": True,
                "httpsEnabled": True,
                "tls": {"mode": "SIMPLE", "credentialName": "ids-tls"},
            },
        },
        "keygen": {"autoscaling": {"enabled": True}},
        "keysync": {"autoscaling": {"enabled": True}},
        "networkPolicy": {
            "postgres": {"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}]},
            "extraEgress": [{"ports": [{"protocol": "TCP", "port": 443}]}],
        },
    },
    # Values given instead of Secrets named: the chart creates the Secrets.
    "given-values": {
        "config": {"id_types": TYPES},
        "image": {"repository": "registry.example.org/ids/keydispenser", "tag": "0.1.0-rc1"},
        "secrets": {
            "permutationKey": {"value": "a long random secret"},
            "postgres": {"dsn": DSNS},
        },
        "monitoring": ALL_ON,
    },
}


@functools.cache
def chart() -> helm.Chart:
    return helm.Chart.load(CHART)


def render_raw(values: Doc, *, upgrade: bool = False) -> dict[str, str]:
    return chart().render(
        values=values, name=RELEASE, namespace=NAMESPACE, is_install=not upgrade, is_upgrade=upgrade
    )


@functools.cache
def rendered(value_set: str) -> tuple[Doc, ...]:
    out = render_raw(VALUE_SETS[value_set])
    return tuple(
        doc
        for path, text in sorted(out.items())
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    )


def objects(value_set: str, kind: str) -> dict[str, Doc]:
    return {d["metadata"]["name"]: d for d in rendered(value_set) if d["kind"] == kind}


def pods(value_set: str) -> Iterator[tuple[str, Doc]]:
    """(process, pod spec) of every Deployment and Job."""
    for doc in rendered(value_set):
        if doc["kind"] in {"Deployment", "Job"}:
            yield doc["metadata"]["labels"]["tier"], doc["spec"]["template"]["spec"]


def container(value_set: str, process: str) -> Doc:
    (pod,) = [p for name, p in pods(value_set) if name == process]
    (only,) = pod["containers"]
    result: Doc = only
    return result


def config(value_set: str) -> Doc:
    text = objects(value_set, "ConfigMap")[f"{FULLNAME}-config"]["data"]["keydispenser.yaml"]
    loaded: Doc = yaml.safe_load(text)
    return loaded


every_set = pytest.mark.parametrize("value_set", sorted(VALUE_SETS))


@every_set
def test_every_object_validates(value_set: str) -> None:
    docs = rendered(value_set)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Job", "ConfigMap", "Service", "PodDisruptionBudget"} <= kinds
    for doc in docs:
        if doc["kind"] in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message}")


def test_the_value_sets_cover_what_operators_choose() -> None:
    total = sum(len(rendered(s)) for s in VALUE_SETS)
    assert len(VALUE_SETS) >= 6 and total >= 100, total


def test_lint_finds_nothing_but_the_dependencies_left_unfetched() -> None:
    report = helm.lint(CHART, VALUE_SETS["defaults"], kube_version=f"v{KUBERNETES_VERSION}")
    problems = [
        m["error"]
        for m in report["messages"]
        if m["severity"] >= 2 and "missing these dependencies" not in m["error"]
    ]
    assert problems == []


@every_set
def test_pods_are_restricted_and_bounded(value_set: str) -> None:
    seen = set()
    for process, pod in pods(value_set):
        seen.add(process)
        assert pod["automountServiceAccountToken"] is False, process
        assert pod["securityContext"]["runAsNonRoot"] is True, process
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, process
        for c in pod["containers"] + pod.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, process
            assert sc["readOnlyRootFilesystem"] is True, process
            assert sc["capabilities"]["drop"] == ["ALL"], process
            assert {"cpu", "memory"} <= set(c["resources"]["requests"]), process
            assert {"cpu", "memory"} <= set(c["resources"]["limits"]), process
            if process != "migrate":
                assert {"startupProbe", "livenessProbe", "readinessProbe"} <= set(c), process
    assert seen == set(PROCESSES)


def secrets_seen(c: Doc) -> dict[str, tuple[str, str]]:
    """Environment variable -> (Secret, key) of one container."""
    refs = {
        e["name"]: e["valueFrom"]["secretKeyRef"]
        for e in c.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert not c.get("envFrom"), "a whole Secret is never mounted"
    return {name: (r["name"], r["key"]) for name, r in refs.items()}


@every_set
def test_each_secret_reaches_only_the_processes_that_use_it(value_set: str) -> None:
    for process, pod in pods(value_set):
        assert not any("secret" in v for v in pod.get("volumes", [])), process
        seen = secrets_seen(container(value_set, process))
        # The permutation key: migrate and keygen, never keysync nor the dispenser.
        assert ("KD_PERMUTATION_KEY" in seen) == (process in {"migrate", "keygen"}), process
        # One role per process (deploy/postgres/roles.sql): each its own DSN.
        assert seen["KD_POSTGRES_DSN"][1] == process
        redis = {n for n in seen if n.startswith("KD_REDIS")}
        assert not (redis and process == "migrate"), "migrate never talks to Redis"
        assert ("KD_DISPENSER__AUTH__API_KEYS" in seen) <= (process == "dispenser")


def test_secrets_named_are_the_ones_referenced() -> None:
    seen = secrets_seen(container("monitoring-istio", "dispenser"))
    assert seen["KD_POSTGRES_DSN"] == ("kd-postgres", "dispenser")
    assert seen["KD_DISPENSER__AUTH__API_KEYS"] == ("kd-api-keys", "KD_DISPENSER__AUTH__API_KEYS")
    assert secrets_seen(container("defaults", "keygen"))["KD_PERMUTATION_KEY"] == (
        "kd-permutation",
        "KD_PERMUTATION_KEY",
    )
    assert objects("defaults", "Secret") == {}, "named Secrets are never rendered"


@every_set
def test_no_secret_is_ever_rendered_without_its_value(value_set: str) -> None:
    for name, secret in objects(value_set, "Secret").items():
        data = {**secret.get("data", {}), **secret.get("stringData", {})}
        assert data and all(data.values()), name


def test_values_given_become_secrets_that_outlive_the_release() -> None:
    secrets = objects("given-values", "Secret")
    permutation = secrets[f"{FULLNAME}-permutation"]
    assert permutation["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    postgres = secrets[f"{FULLNAME}-postgres"]
    assert set(postgres["data"]) == set(PROCESSES)
    # Created before the migrate hook that reads them: hooks of a lower weight.
    job = objects("given-values", "Job")[f"{FULLNAME}-migrate"]
    for secret in (permutation, postgres):
        annotations = secret["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == job["metadata"]["annotations"]["helm.sh/hook"]
        assert int(annotations["helm.sh/hook-weight"]) < int(
            job["metadata"]["annotations"]["helm.sh/hook-weight"]
        )
        assert "hook-succeeded" not in annotations["helm.sh/hook-delete-policy"]
    keygen = secrets_seen(container("given-values", "keygen"))
    assert keygen["KD_PERMUTATION_KEY"][0] == f"{FULLNAME}-permutation"


@pytest.mark.parametrize(
    ("secrets", "named"),
    [
        ({"postgres": {"existingSecret": "kd-postgres"}}, "secrets.permutationKey"),
        ({"permutationKey": {"existingSecret": "kd-permutation"}}, "secrets.postgres"),
        ({**NAMED, "postgres": {"dsn": {**DSNS, "keysync": ""}}}, "dsn.keysync"),
        ({**NAMED, "redis": {"existingSecret": "kd-redis", "passwordKey": "pw"}}, "urlKey"),
    ],
)
def test_an_incomplete_secret_setting_fails_the_install(secrets: Doc, named: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape(named)):
        render_raw({"config": {"id_types": TYPES}, "secrets": secrets})


def test_no_id_type_is_shipped_none_named_fails_the_install() -> None:
    """A keyspace never changes once keys exist: the operator names every type."""
    assert chart().values["config"]["id_types"] == {}
    with pytest.raises(helm.HelmRenderError, match=r"config\.id_types"):
        render_raw({"secrets": NAMED})


def test_migrate_is_a_hook_before_install_and_upgrade() -> None:
    job = objects("defaults", "Job")[f"{FULLNAME}-migrate"]
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    # The previous Job is deleted before the next one runs: no manual deletion.
    assert "before-hook-creation" in annotations["helm.sh/hook-delete-policy"].split(",")
    # Its configuration: a hook too (a pre-install hook runs before the chart's own
    # ConfigMap exists), created first, with the same content.
    (volume,) = [v for v in job["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
    copy = objects("defaults", "ConfigMap")[volume["configMap"]["name"]]
    assert copy["metadata"]["annotations"]["helm.sh/hook"] == annotations["helm.sh/hook"]
    assert int(copy["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
        annotations["helm.sh/hook-weight"]
    )
    main = objects("defaults", "ConfigMap")[f"{FULLNAME}-config"]
    assert copy["data"] == main["data"]
    assert "helm.sh/hook" not in main["metadata"].get("annotations", {})


def test_upgrades_render_the_same_objects() -> None:
    install = {(d["kind"], d["metadata"]["name"]) for d in rendered("given-values")}
    upgrade = render_raw(VALUE_SETS["given-values"], upgrade=True)
    docs = [d for p, t in upgrade.items() if p.endswith(".yaml") for d in yaml.safe_load_all(t)]
    assert {(d["kind"], d["metadata"]["name"]) for d in docs if d} == install


def test_probes_are_those_of_each_process() -> None:
    for process in ("keygen", "keysync"):
        c = container("defaults", process)
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
        assert c["startupProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env[f"KD_{process.upper()}__METRICS_HOST"] == "0.0.0.0"
        (port,) = c["ports"]
        assert env[f"KD_{process.upper()}__METRICS_PORT"] == str(port["containerPort"])
    c = container("defaults", "dispenser")
    env = {e["name"]: e.get("value") for e in c["env"]}
    (port,) = c["ports"]
    assert env["KD_DISPENSER__PORT"] == str(port["containerPort"])
    assert env["KD_DISPENSER__HOST"] == "0.0.0.0"
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["args"] == ["dispenser"]


def test_image_defaults_to_the_app_version() -> None:
    app_version = chart().metadata["appVersion"]
    for _, pod in pods("defaults"):
        assert pod["containers"][0]["image"] == f"keydispenser:{app_version}"
    for _, pod in pods("given-values"):
        assert pod["containers"][0]["image"] == "registry.example.org/ids/keydispenser:0.1.0-rc1"


@every_set
def test_the_configuration_loads_with_each_process_environment(
    value_set: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ConfigMap's file with the environment each container gets (a Secret's value
    stood in for): every variable the chart sets is a setting, and a password given
    beside redis_sentinel or redis_cluster joins the file's addresses."""
    path = tmp_path / "keydispenser.yaml"
    path.write_text(yaml.safe_dump(config(value_set)))
    stand_ins = {
        "KD_POSTGRES_DSN": "postgresql://kd@pg:5432/kd",
        "KD_REDIS_URL": "redis://r:6379/0",
        "KD_DISPENSER__AUTH__API_KEYS": "[]",
    }
    for process in PROCESSES:
        with monkeypatch.context() as env:
            for name in [n for n in os.environ if n.startswith("KD_")]:
                env.delenv(name)
            given = container(value_set, process)["env"]
            for var in given:
                if var["name"] != "KD_CONFIG":
                    env.setenv(var["name"], var.get("value", stand_ins.get(var["name"], "x")))
            settings = load_settings(path)
        assert set(settings.id_types) == {"farmer", "shortlink"}, process
        if process == "dispenser":
            assert settings.dispenser.host == "0.0.0.0"
        if "redis_sentinel" in config(value_set) or "redis_cluster" in config(value_set):
            found = settings.redis_sentinel or settings.redis_cluster
            assert found is not None and found.seeds(), process
            if any(v["name"].endswith("__PASSWORD") for v in given):
                assert found.password is not None, process


def test_sentinel_wiring() -> None:
    assert config("sentinel")["redis_sentinel"]["sentinels"] == SENTINELS
    for process in ("keygen", "keysync", "dispenser"):
        seen = secrets_seen(container("sentinel", process))
        assert seen["KD_REDIS_SENTINEL__PASSWORD"] == ("kd-redis", "password")
        assert seen["KD_REDIS_SENTINEL__SENTINEL_PASSWORD"] == ("kd-redis", "sentinel-password")


def test_cluster_wiring() -> None:
    assert config("cluster")["redis_cluster"] == {"nodes": NODES, "slot_per": "type"}
    seen = secrets_seen(container("cluster", "keysync"))
    assert seen == {
        "KD_POSTGRES_DSN": ("kd-postgres", "keysync"),
        "KD_REDIS_CLUSTER__PASSWORD": ("kd-redis", "password"),
    }


def test_a_redis_url_with_its_password_comes_whole_from_a_secret() -> None:
    secrets = {**NAMED, "redis": {"existingSecret": "kd-redis", "urlKey": "url"}}
    out = render_raw({"config": {"id_types": TYPES}, "secrets": secrets})
    docs = [d for p, t in out.items() if p.endswith(".yaml") for d in yaml.safe_load_all(t) if d]
    for doc in docs:
        if doc["kind"] in {"Deployment", "Job"}:
            (c,) = doc["spec"]["template"]["spec"]["containers"]
            seen = secrets_seen(c).get("KD_REDIS_URL")
            assert seen == (None if c["name"] == "migrate" else ("kd-redis", "url")), c["name"]


def test_each_process_can_log_in_to_redis_as_its_own_acl_user() -> None:
    """secrets.redis.userKeys (a Redis ACL user per process, `keydispenser redis-acl`):
    behind Sentinel each process logs in as <redis_namespace>-<process> with its own
    password; with redis_url each gets its own whole URL. Never another's."""
    own = {p: f"{p}-redis" for p in ("keygen", "keysync", "dispenser")}
    sentinel = VALUE_SETS["sentinel"]
    values = {
        **sentinel,
        "secrets": {**NAMED, "redis": {"existingSecret": "kd-redis", "userKeys": own}},
    }
    url = {"config": {"id_types": TYPES}, "secrets": values["secrets"]}
    for given, variable in ((values, "KD_REDIS_SENTINEL__PASSWORD"), (url, "KD_REDIS_URL")):
        out = render_raw(given)
        docs = [
            d for p, t in out.items() if p.endswith(".yaml") for d in yaml.safe_load_all(t) if d
        ]
        for doc in docs:
            if doc["kind"] not in {"Deployment", "Job"}:
                continue
            (c,) = doc["spec"]["template"]["spec"]["containers"]
            name = c["name"].removesuffix("-granian")
            seen = secrets_seen(c)
            if name == "migrate":
                assert not any(v.startswith("KD_REDIS") for v in seen), seen
                continue
            assert seen[variable] == ("kd-redis", own[name]), (name, seen)
            user = {e["name"]: e.get("value") for e in c["env"]}.get("KD_REDIS_SENTINEL__USERNAME")
            assert user == (f"kd-{name}" if variable != "KD_REDIS_URL" else None), (name, user)


def test_dependency_charts_are_wired_by_their_own_names() -> None:
    """Bitnami's objects are named <release>-<chart>: the Sentinels on the headless
    Service of the nodes, the cluster's nodes likewise, each with its password."""
    sentinel = config("bitnami-sentinel")
    assert "redis_url" not in sentinel
    assert sentinel["redis_sentinel"] == {
        "master_name": "mymaster",
        "sentinels": [f"{RELEASE}-redis-node-{i}.{RELEASE}-redis-headless:26379" for i in range(3)],
    }
    seen = secrets_seen(container("bitnami-sentinel", "dispenser"))
    assert seen["KD_REDIS_SENTINEL__PASSWORD"] == (f"{RELEASE}-redis", "redis-password")
    cluster = config("bitnami-cluster")["redis_cluster"]
    name = f"{RELEASE}-redis-cluster"
    assert cluster["nodes"] == [f"{name}-{i}.{name}-headless:6379" for i in range(6)]
    seen = secrets_seen(container("bitnami-cluster", "keygen"))
    assert seen["KD_REDIS_CLUSTER__PASSWORD"] == (name, "redis-password")


def test_rancher_asks_only_for_values_the_chart_has() -> None:
    questions = yaml.safe_load((CHART / "questions.yaml").read_text())["questions"]
    asked = [each for q in questions for each in (q, *q.get("subquestions", []))]
    for question in asked:
        node: Any = chart().values
        for part in question["variable"].split("."):
            assert isinstance(node, dict) and part in node, question["variable"]
            node = node[part]
    variables = {q["variable"] for q in asked}
    assert {"image.repository", "secrets.permutationKey.existingSecret"} <= variables
    assert "secrets.postgres.existingSecret" in variables


def test_dependencies_are_optional_and_not_vendored() -> None:
    values = chart().values
    declared = yaml.safe_load((CHART / "Chart.yaml").read_text())["dependencies"]
    assert {d["name"] for d in declared} == {"redis", "redis-cluster"}
    for dep in declared:
        assert dep["condition"] == f"{dep['name']}.enabled"
        assert values[dep["name"]]["enabled"] is False
    assert not (CHART / "charts").exists()


def test_dependency_redis_is_configured_as_keydispenser_needs() -> None:
    """The ledger stream survives a restart; no eviction; a primary cut off from its
    replicas stops taking writes; no DEBUG RELOAD of an older file in place
    (docs/reliability.md)."""
    values = chart().values
    flags = (
        "appendonly yes",
        "appendfsync everysec",
        "maxmemory-policy noeviction",
        "min-replicas-to-write 1",
        "enable-debug-command no",
    )
    for flag in flags:
        assert flag in values["redis"]["commonConfiguration"], flag
    cluster = values["redis-cluster"]["redis"]
    assert cluster["useAOFPersistence"] == "yes"
    for flag in (*flags[1:], "cluster-require-full-coverage no"):
        assert flag in cluster["configmap"], flag
    assert (
        values["redis"]["sentinel"]["enabled"] and values["redis"]["replica"]["replicaCount"] >= 2
    )


@every_set
def test_network_policies_select_only_keydispenser(value_set: str) -> None:
    """Never a shared store's pods (which other clients use): policies are on
    keydispenser's own pods, one per process, limiting what they reach."""
    policies = objects(value_set, "NetworkPolicy")
    assert {p["spec"]["podSelector"]["matchLabels"]["tier"] for p in policies.values()} == set(
        PROCESSES
    )
    for name, policy in policies.items():
        selector = policy["spec"]["podSelector"]["matchLabels"]
        assert selector["app.kubernetes.io/name"] == "keydispenser", name
        assert selector["app.kubernetes.io/instance"] == RELEASE, name
        assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}, name
        ports = {p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"]}
        assert {53, 5432} <= ports, name
        assert ({6379, 26379} <= ports) == (selector["tier"] != "migrate"), name


def test_network_policy_peers_come_from_values() -> None:
    policy = objects("monitoring-istio", "NetworkPolicy")[f"{FULLNAME}-keysync"]
    (rule,) = [
        r for r in policy["spec"]["egress"] if {"port": 5432, "protocol": "TCP"} in r["ports"]
    ]
    assert rule["to"] == [{"ipBlock": {"cidr": "10.20.0.0/16"}}]
    ports = {p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"]}
    assert {443, 15012} <= ports, "extraEgress, and istiod for the Istio sidecar"
    for policy in objects("defaults", "NetworkPolicy").values():
        ports = {p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"]}
        assert not ports & {443, 15012}


def test_migrate_runs_without_a_sidecar() -> None:
    """An Istio sidecar never exits: the Job would never complete, nor the hook."""
    job = objects("monitoring-istio", "Job")[f"{FULLNAME}-migrate"]
    annotations = job["spec"]["template"]["metadata"]["annotations"]
    assert annotations["sidecar.istio.io/inject"] == "false"


def test_every_tier_can_autoscale_and_is_covered_by_a_budget() -> None:
    hpas = objects("monitoring-istio", "HorizontalPodAutoscaler")
    deployments = objects("monitoring-istio", "Deployment")
    assert {h["spec"]["scaleTargetRef"]["name"] for h in hpas.values()} == set(deployments)
    assert all("replicas" not in d["spec"] for d in deployments.values())
    # By default only the dispensers scale on CPU.
    defaults = objects("defaults", "HorizontalPodAutoscaler").values()
    assert [h["spec"]["scaleTargetRef"]["name"] for h in defaults] == [f"{FULLNAME}-dispenser"]
    budgets = objects("defaults", "PodDisruptionBudget")
    assert {b["spec"]["selector"]["matchLabels"]["tier"] for b in budgets.values()} == {
        "keygen",
        "keysync",
        "dispenser",
    }


def test_istio_routes_the_api_to_the_dispensers() -> None:
    (service,) = objects("monitoring-istio", "VirtualService").values()
    (gateway,) = objects("monitoring-istio", "Gateway").values()
    assert service["spec"]["gateways"] == [gateway["metadata"]["name"]]
    assert service["spec"]["hosts"] == ["ids.example.org"]
    (route,) = service["spec"]["http"]
    (destination,) = route["route"]
    dispenser = objects("monitoring-istio", "Service")[FULLNAME]
    assert destination["destination"]["host"] == dispenser["metadata"]["name"]
    assert destination["destination"]["port"]["number"] == dispenser["spec"]["ports"][0]["port"]
    assert "/metrics" not in route["match"][0]["uri"]["prefix"]
    servers = {s["port"]["protocol"]: s for s in gateway["spec"]["servers"]}
    assert servers["HTTPS"]["tls"]["credentialName"] == "ids-tls"


def test_monitoring_objects_carry_the_shipped_alerts_and_dashboard() -> None:
    (monitor,) = objects("monitoring-istio", "ServiceMonitor").values()
    assert monitor["spec"]["podTargetLabels"] == ["tier"]
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == {"http", "metrics"}
    (rule,) = objects("monitoring-istio", "PrometheusRule").values()
    assert rule["spec"] == yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    dashboard = objects("monitoring-istio", "ConfigMap")[f"{FULLNAME}-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((CHART / "files" / "dashboard.json").read_text())
    assert json.loads(dashboard["data"]["keydispenser.json"]) == shipped
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert objects("defaults", kind) == {}, "off unless asked for"


@pytest.mark.parametrize(
    "bad",
    [
        {"keygen": {"replicas": -1}},
        {"config": {"id_types": {"Not-An-Identifier": {"kind": "numeric", "length": 10}}}},
        {"podSecurityContext": {"runAsNonRoot": False}},
        {"containerSecurityContext": {"readOnlyRootFilesystem": False}},
        {"dispenser": {"service": {"type": "ExternalName"}}},
        {"secrets": {**NAMED, "permutationKey": {"existingSecret": 42}}},
        {"monitoring": {"serviceMonitor": {"interval": "often"}}},
        {"replicaCount": 3},
    ],
    ids=lambda bad: next(iter(bad)),
)
def test_the_schema_rejects_bad_values(bad: Doc) -> None:
    with pytest.raises(helm.HelmValuesError):
        render_raw({"config": {"id_types": TYPES}, "secrets": NAMED, **bad})


def exported_names() -> set[str]:
    """Every series name the code's registries can produce (counters as ``_total``)."""
    families: list[Metric] = []
    for make in (KeygenMetrics, KeysyncMetrics, DispenserMetrics, Heartbeat):
        reg = CollectorRegistry()
        make(reg)
        families += list(reg.collect())
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
    return {f.name + s for f in families for s in suffixes.get(f.type, [""])}


def alerts() -> list[Doc]:
    rules = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    return [r for g in rules["groups"] for r in g["rules"]]


def monitoring_expressions() -> list[tuple[str, str]]:
    exprs = [(r["alert"], r["expr"]) for r in alerts()]
    dashboard = json.loads((CHART / "files" / "dashboard.json").read_text())
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
    headings = {
        re.sub(r"[^a-z0-9-]", "", line.lstrip("#").strip().lower().replace(" ", "-"))
        for line in OPERATIONS.read_text().splitlines()
        if line.startswith("#")
    }
    wanted = {
        "headroom",
        "exhaustion",
        "hotdepth",
        "idg001",
        "keysync",
        "keygen",
        "redisfence",
        "postgresfence",
        "ledgerduplicates",
        "ledgerbacklog",
        "redisprimary",
    }
    names = " ".join(r["alert"].lower() for r in alerts())
    assert all(w in names for w in wanted), wanted
    for rule in alerts():
        url = rule["annotations"]["runbook_url"]
        assert url.startswith("docs/operations.md#")
        assert url.split("#", 1)[1] in headings, rule["alert"]
