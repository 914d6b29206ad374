"""What the rendered workloads promise: probes, ports, security, state, sidecars and the network fence."""

from __future__ import annotations

import pytest

from tests.deploy.container_config import resolve
from tests.deploy.k8s_objects import (
    PodTemplate,
    container_port_names,
    of_kind,
    only,
    pod_templates,
    quantity_bytes,
    referenced_config,
    selector_matches,
    variable_references,
)
from tests.deploy.tools import KUSTOMIZATIONS, render

OVERLAYS = ("overlays/dev", "overlays/prod")
CLIENT_ROLES = {"rollout", "trainer", "reorg"}

# Secrets an operator creates out of band (docs/deploy.md); everything else must be rendered.
EXTERNAL_SECRETS = {
    "overlays/dev": set(),
    "overlays/prod": {"knittrans-admission-token", "knittrans-redis", "knittrans-admission-tls"},
    "examples/trainer-job": {"knittrans-admission-token", "knittrans-admission-client-tls"},
    "examples/trainer-statefulset": {"knittrans-admission-token", "knittrans-admission-client-tls"},
    "examples/node-sidecars": {"knittrans-admission-token", "knittrans-admission-client-tls"},
}

# hostPath is a deliberate choice in exactly these places: a one-node dev cluster, and node-level sidecars.
HOST_PATH_ALLOWED = {
    ("overlays/dev", "Deployment/knittrans-admission"),
    ("examples/node-sidecars", "DaemonSet/knittrans-reorg-dp0-cp0"),
}


def admission(overlay: str) -> PodTemplate:
    return next(t for t in pod_templates(render(overlay)) if t.name == "Deployment/knittrans-admission")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_admission_probes_are_native_grpc_on_a_declared_port(overlay: str) -> None:
    container = admission(overlay).container("admission")
    ports = set(container_port_names(container).values())
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert "grpc" in container[probe], f"{probe} is not a gRPC probe"
        assert container[probe]["grpc"]["port"] in ports, f"{probe} targets an undeclared port"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_admission_service_exposes_grpc_and_metrics(overlay: str) -> None:
    objects = render(overlay)
    template = admission(overlay)
    service = only(objects, "Service", "knittrans-admission")
    assert selector_matches({"matchLabels": service["spec"]["selector"]}, template.labels)
    by_name = {p["name"]: p for p in service["spec"]["ports"]}
    assert set(by_name) == {"grpc", "metrics"}
    declared = container_port_names(template.container("admission"))
    assert {by_name["grpc"]["targetPort"], by_name["metrics"]["targetPort"]} <= set(declared)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_admission_config_comes_from_a_config_map_and_the_token_from_a_secret(overlay: str) -> None:
    template = admission(overlay)
    container = template.container("admission")
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert container["args"][:4] == ["admission", "serve", "--config", f"{mount['mountPath']}/admission.yaml"]
    token = next(e for e in container["env"] if e["name"] == "KNITTRANS_SERVER__AUTH__TOKEN")
    reference = token["valueFrom"]["secretKeyRef"]
    assert reference["key"] == "token"
    # A generated Secret (dev) carries a content-hash suffix; prod's is created out of band.
    assert reference["name"].startswith("knittrans-admission-token")


def test_redis_is_a_statefulset_with_aof_on_a_persistent_volume() -> None:
    objects = render("overlays/prod")
    redis = only(objects, "StatefulSet", "knittrans-redis")
    template = next(t for t in pod_templates(objects) if t.name == "StatefulSet/knittrans-redis")
    container = template.container("redis")
    config_map = only(objects, "ConfigMap", template.volume("config")["configMap"]["name"])
    settings = dict(
        line.split(None, 1)
        for line in config_map["data"]["redis.conf"].splitlines()
        if line.strip() and not line.startswith("#")
    )
    assert settings["appendonly"] == "yes"
    assert settings["appendfsync"] in {"always", "everysec"}
    assert settings["maxmemory-policy"] == "noeviction"
    data_mount = next(m for m in container["volumeMounts"] if m["mountPath"] == settings["dir"])
    claim = next(c for c in redis["spec"]["volumeClaimTemplates"] if c["metadata"]["name"] == data_mount["name"])
    assert claim["spec"]["resources"]["requests"]["storage"]
    assert container["args"][:2] == ["redis-server", "/etc/redis/redis.conf"]
    redis_policy = only(objects, "NetworkPolicy", "knittrans-redis")
    peers = [peer for rule in redis_policy["spec"]["ingress"] for peer in rule["from"]]
    assert peers == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "knittrans-admission"}}}]


def test_mooncake_master_serves_rpc_on_50052_behind_a_service() -> None:
    objects = render("overlays/prod")
    template = next(t for t in pod_templates(objects) if t.name == "Deployment/knittrans-mooncake-master")
    container = template.container("mooncake-master")
    assert container["command"] == ["mooncake_master"]
    assert "--rpc_port=50052" in container["args"]
    service = only(objects, "Service", "knittrans-mooncake-master")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"rpc": 50052, "metrics": 9003}
    assert selector_matches({"matchLabels": service["spec"]["selector"]}, template.labels)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_container_runs_locked_down(kustomization: str) -> None:
    problems = []
    for template in pod_templates(render(kustomization)):
        pod_security = template.spec.get("securityContext", {})
        for container in template.containers():
            security = {**pod_security, **container.get("securityContext", {})}
            where = f"{template.name} container {container['name']}"
            if security.get("runAsNonRoot") is not True or not security.get("runAsUser"):
                problems.append(f"{where}: not runAsNonRoot with a non-zero runAsUser")
            if container.get("securityContext", {}).get("readOnlyRootFilesystem") is not True:
                problems.append(f"{where}: root filesystem is writable")
            if container.get("securityContext", {}).get("capabilities", {}).get("drop") != ["ALL"]:
                problems.append(f"{where}: capabilities not all dropped")
            if container.get("securityContext", {}).get("allowPrivilegeEscalation") is not False:
                problems.append(f"{where}: privilege escalation allowed")
            if security.get("seccompProfile", {}).get("type") != "RuntimeDefault":
                problems.append(f"{where}: no RuntimeDefault seccomp profile")
            resources = container.get("resources", {})
            if not resources.get("requests", {}).get("cpu") or not resources.get("limits", {}).get("memory"):
                problems.append(f"{where}: no cpu request or memory limit")
        for volume in template.spec.get("volumes", []):
            if "hostPath" in volume and (kustomization, template.name) not in HOST_PATH_ALLOWED:
                problems.append(f"{template.name}: unexpected hostPath volume {volume['name']}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_referenced_config_map_and_secret_exists(kustomization: str) -> None:
    objects = render(kustomization)
    rendered = {(o["kind"], o["metadata"]["name"]) for o in objects}
    missing = []
    for template in pod_templates(objects):
        for kind, name in referenced_config(template):
            if (kind, name) not in rendered and not (kind == "Secret" and name in EXTERNAL_SECRETS[kustomization]):
                missing.append(f"{template.name} reads {kind} {name}")
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_variable_references_in_args_and_env_are_defined(kustomization: str) -> None:
    problems = []
    for template in pod_templates(render(kustomization)):
        for container in template.containers():
            env = container.get("env", [])
            names = [e["name"] for e in env]
            for index, entry in enumerate(env):
                # Kubernetes expands $(VAR) in a value only from variables defined earlier in the list.
                for ref in variable_references(str(entry.get("value", ""))) - set(names[:index]):
                    problems.append(f"{template.name}/{container['name']} env {entry['name']} uses $({ref})")
            for ref in variable_references(" ".join(map(str, container.get("args", [])))) - set(names):
                problems.append(f"{template.name}/{container['name']} args use undefined $({ref})")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_selectors_of_services_budgets_and_policies_match_rendered_pods(kustomization: str) -> None:
    objects = render(kustomization)
    templates = pod_templates(objects)
    problems = []
    for obj in objects:
        if obj["kind"] == "Service":
            selector = {"matchLabels": obj["spec"]["selector"]}
        elif obj["kind"] == "PodDisruptionBudget":
            selector = obj["spec"]["selector"]
        elif obj["kind"] == "NetworkPolicy":
            selector = obj["spec"]["podSelector"]
        else:
            continue
        if not any(selector_matches(selector, t.labels) for t in templates):
            problems.append(f"{obj['kind']} {obj['metadata']['name']} selects no rendered pod")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_admission_is_a_recreated_singleton_with_a_disruption_budget(overlay: str) -> None:
    objects = render(overlay)
    deployment = only(objects, "Deployment", "knittrans-admission")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    budget = only(objects, "PodDisruptionBudget", "knittrans-admission")
    assert selector_matches(budget["spec"]["selector"], admission(overlay).labels)
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    if overlay == "overlays/dev":  # in-memory state: no voluntary eviction
        assert budget["spec"].get("minAvailable") == 1 and "maxUnavailable" not in budget["spec"]
    else:  # Redis-journaled state: a drain may restart it
        assert budget["spec"].get("maxUnavailable") == 1 and "minAvailable" not in budget["spec"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policy_admits_only_rollout_trainer_and_sidecar_pods(overlay: str) -> None:
    policy = only(render(overlay), "NetworkPolicy", "knittrans-admission")
    assert selector_matches(policy["spec"]["podSelector"], admission(overlay).labels)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    grpc_rules = [r for r in policy["spec"]["ingress"] if {"port": "grpc", "protocol": "TCP"} in r["ports"]]
    assert len(grpc_rules) == 1
    peers = grpc_rules[0]["from"]
    assert len(peers) == 1
    selector = peers[0]["podSelector"]
    for role in CLIENT_ROLES:
        assert selector_matches(selector, {"knittrans.io/role": role})
    for outsider in ({"knittrans.io/role": "notebook"}, {}, {"app.kubernetes.io/name": "knittrans-redis"}):
        assert not selector_matches(selector, outsider)
    if overlay == "overlays/dev":
        assert "namespaceSelector" not in peers[0], "dev admits clients from its own namespace only"
    other_ports = [p["port"] for r in policy["spec"]["ingress"] if r is not grpc_rules[0] for p in r["ports"]]
    assert other_ports == ["metrics"]


@pytest.mark.parametrize("kustomization", ["examples/trainer-job", "examples/trainer-statefulset"])
def test_reorg_sidecar_shares_shm_and_socket_with_the_trainer(kustomization: str) -> None:
    objects = render(kustomization)
    (template,) = pod_templates(objects)
    sidecar = next(c for c in template.spec["initContainers"] if c["name"] == "knittrans-reorg")
    trainer = template.container("trainer")
    assert sidecar["restartPolicy"] == "Always", "the sidecar must be a native sidecar"
    args = sidecar["args"]
    assert args[:2] == ["reorg", "serve"]
    for flag in ("--config", "--role", "--dp-rank", "--cp-rank"):
        assert flag in args
    shm = template.volume("dshm")["emptyDir"]
    assert shm["medium"] == "Memory"
    assert quantity_bytes(shm["sizeLimit"]) > 64 * 2**20, "no bigger than the runtime's 64 MiB default"
    assert quantity_bytes(sidecar["resources"]["limits"]["memory"]) > quantity_bytes(shm["sizeLimit"]), (
        "the ring's tmpfs pages are charged to the sidecar that writes them"
    )

    def mounts(container) -> dict[str, str]:
        return {m["name"]: m["mountPath"] for m in container["volumeMounts"]}

    for volume, path in (("dshm", "/dev/shm"), ("knittrans-run", "/var/run/knittrans")):
        assert mounts(sidecar)[volume] == mounts(trainer)[volume] == path
    assert resolve(objects, template, "knittrans-reorg").load().socket_path.startswith("/var/run/knittrans/")
    assert template.labels["knittrans.io/role"] == "trainer"
    rank_env = next(e for e in sidecar["env"] if e["name"] == "REORG_DP_RANK")
    expected_label = (
        "batch.kubernetes.io/job-completion-index"
        if template.workload["kind"] == "Job"
        else "apps.kubernetes.io/pod-index"
    )
    assert rank_env["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.labels['{expected_label}']"


def test_reorg_daemonset_serves_its_node_through_host_shm() -> None:
    objects = render("examples/node-sidecars")
    daemonset = only(objects, "DaemonSet")
    (template,) = pod_templates(objects)
    assert template.labels["knittrans.io/role"] == "reorg"
    assert daemonset["spec"]["template"]["spec"]["nodeSelector"]
    volume = template.volume("host-shm")
    assert volume["hostPath"] == {"path": "/dev/shm", "type": "Directory"}
    container = template.container("reorg")
    assert {"name": "host-shm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert resolve(objects, template, "reorg").load().socket_path.startswith("/dev/shm/")


def test_pod_monitor_scrapes_every_kind_of_sidecar() -> None:
    monitor = only(render("overlays/prod"), "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    port = monitor["spec"]["podMetricsEndpoints"][0]["port"]
    for example, container in (
        ("examples/trainer-job", "knittrans-reorg"),
        ("examples/trainer-statefulset", "knittrans-reorg"),
        ("examples/node-sidecars", "reorg"),
    ):
        (template,) = pod_templates(render(example))
        assert selector_matches(monitor["spec"]["selector"], template.labels), example
        assert port in container_port_names(template.container(container)), example


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_monitors_select_a_service_with_the_scraped_port(overlay: str) -> None:
    objects = render(overlay)
    for monitor in of_kind(objects, "ServiceMonitor"):
        services = [
            s
            for s in of_kind(objects, "Service")
            if selector_matches(monitor["spec"]["selector"], s["metadata"].get("labels", {}))
        ]
        assert len(services) == 1, monitor["metadata"]["name"]
        port_names = {p["name"] for p in services[0]["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= port_names
