"""The config every KnitTrans container of the manifests starts with loads through the service's real settings
class, and what it says agrees with the rest of the manifests: ports, probes, mounts, Secrets and Services.

A key the service does not know (a guessed or renamed one) makes `load_config` raise, so drift between the
manifests and `AdmissionServiceSettings` or `ReorgSettings` fails here rather than in a crash-looping pod.
"""

from __future__ import annotations

import posixpath

import pytest
from redis.connection import parse_url

from knittrans.errors import ConfigError
from knittrans.store.factory import FileStoreSpec, parse_store_url
from knittrans.store.mooncake import MooncakeStoreConfig
from tests.deploy.container_config import (
    POD_IP,
    ContainerConfig,
    resolve,
    secret_stand_in,
    service_for,
)
from tests.deploy.k8s_objects import container_port_names, only, pod_templates
from tests.deploy.tools import KUSTOMIZATIONS, render

# The admission Deployment of each kustomization that renders one (base: what the overlays start from).
ADMISSION = ("base", "overlays/dev", "overlays/prod")
# (kustomization, container) of every reorg sidecar; they all join the prod control plane.
REORG = (
    ("examples/trainer-job", "knittrans-reorg"),
    ("examples/trainer-statefulset", "knittrans-reorg"),
    ("examples/node-sidecars", "reorg"),
)
CONTROL_PLANE = "overlays/prod"
WILDCARD_HOSTS = {"0.0.0.0", "::", "[::]"}


def namespace_of(kustomization: str) -> str:
    namespaces = {o["metadata"].get("namespace", "default") for o in render(kustomization) if o["kind"] != "Namespace"}
    (namespace,) = namespaces - {"default"} or {"default"}
    return namespace


def admission_container(kustomization: str) -> ContainerConfig:
    objects = render(kustomization)
    template = next(t for t in pod_templates(objects) if t.name == "Deployment/knittrans-admission")
    return resolve(objects, template, "admission")


def reorg_container(kustomization: str, container: str) -> ContainerConfig:
    objects = render(kustomization)
    (template,) = pod_templates(objects)
    return resolve(objects, template, container)


def declared_ports(kustomization: str, workload: str, container: str) -> dict[str, int]:
    template = next(t for t in pod_templates(render(kustomization)) if t.name == workload)
    return container_port_names(template.container(container))


def probe_ports(kustomization: str, workload: str, container: str) -> set[int]:
    template = next(t for t in pod_templates(render(kustomization)) if t.name == workload)
    spec = template.container(container)
    return {spec[p]["grpc"]["port"] for p in ("startupProbe", "readinessProbe", "livenessProbe") if "grpc" in spec[p]}


def assert_secret_file(config: ContainerConfig, path: str, secret: str) -> None:
    volume = config.volume_at(path)
    assert volume.get("secret", {}).get("secretName") == secret, f"{path} is not from the Secret {secret}"


@pytest.mark.parametrize("kustomization", ADMISSION)
def test_admission_config_loads_into_the_real_settings(kustomization: str) -> None:
    settings = admission_container(kustomization).load()
    assert settings.engine.sources and settings.topology.backbone.dp >= 1


@pytest.mark.parametrize("kustomization", ADMISSION)
def test_admission_listens_on_the_pod_ip_at_the_declared_ports(kustomization: str) -> None:
    server = admission_container(kustomization).load().server
    assert server.host in WILDCARD_HOSTS, "kubelet probes and clients reach the pod IP, not loopback"
    assert server.metrics.host in WILDCARD_HOSTS, "Prometheus scrapes the pod IP, not loopback"
    ports = declared_ports(kustomization, "Deployment/knittrans-admission", "admission")
    assert server.port == ports["grpc"]
    assert server.metrics.port == ports["metrics"]


@pytest.mark.parametrize("kustomization", ADMISSION)
def test_admission_probes_reach_a_plaintext_health_service(kustomization: str) -> None:
    server = admission_container(kustomization).load().server
    probes = probe_ports(kustomization, "Deployment/knittrans-admission", "admission")
    if server.tls.enabled:  # kubelet's gRPC probes speak plaintext only
        assert server.health_port > 0
        assert probes == {server.health_port}
        declared = declared_ports(kustomization, "Deployment/knittrans-admission", "admission")
        assert server.health_port in declared.values()
        service = only(render(kustomization), "Service", "knittrans-admission")
        assert server.health_port not in {p["port"] for p in service["spec"]["ports"]}, "health stays off the Service"
    else:
        assert probes == {server.port}


@pytest.mark.parametrize("kustomization", ADMISSION)
def test_admission_token_comes_from_the_token_secret(kustomization: str) -> None:
    config = admission_container(kustomization)
    auth = config.load().server.auth
    if kustomization == "overlays/dev":
        assert auth.token == "knittrans-dev-token-not-a-secret"
    else:
        assert auth.token == secret_stand_in("knittrans-admission-token", "token")


def test_dev_keeps_state_in_memory_and_units_on_the_nodes_shm() -> None:
    config = admission_container("overlays/dev")
    settings = config.load()
    assert settings.state == "memory"
    assert not settings.server.tls.enabled
    store = parse_store_url(settings.store, job=settings.job)
    assert isinstance(store, FileStoreSpec)
    assert config.volume_at(str(store.root)).get("hostPath", {}).get("path") == "/dev/shm"
    names = [o["metadata"]["name"] for o in render("overlays/dev")]
    assert not [n for n in names if n.startswith(("knittrans-redis", "knittrans-mooncake"))]


def test_prod_journals_to_redis_stores_in_mooncake_and_serves_mtls() -> None:
    config = admission_container("overlays/prod")
    settings = config.load()
    redis = parse_url(settings.state)
    assert redis["password"] == secret_stand_in("knittrans-redis", "password")
    address = f"{redis['host']}:{redis['port']}"
    service, _, _ = service_for(address, namespace="knittrans", kustomization="overlays/prod")
    assert service == "knittrans-redis"
    store = parse_store_url(settings.store, job=settings.job)
    assert isinstance(store, MooncakeStoreConfig)
    service, port_name, _ = service_for(store.master_address, namespace="knittrans", kustomization="overlays/prod")
    assert (service, port_name) == ("knittrans-mooncake-master", "rpc")
    tls = settings.server.tls
    assert tls.enabled and tls.client_ca_file, "prod serves mTLS"
    for path, key in ((tls.cert_file, "tls.crt"), (tls.key_file, "tls.key"), (tls.client_ca_file, "ca.crt")):
        assert posixpath.basename(path) == key
        assert_secret_file(config, path, "knittrans-admission-tls")


@pytest.mark.parametrize(("kustomization", "container"), REORG)
def test_reorg_config_loads_into_the_real_settings(kustomization: str, container: str) -> None:
    settings = reorg_container(kustomization, container).load()
    assert settings.role == "backbone"


@pytest.mark.parametrize(("kustomization", "container"), REORG)
def test_reorg_serves_its_socket_and_metrics_where_the_pod_expects(kustomization: str, container: str) -> None:
    config = reorg_container(kustomization, container)
    settings = config.load()
    (template,) = pod_templates(render(kustomization))
    spec = template.container(container)
    assert spec["startupProbe"]["exec"]["command"] == ["test", "-S", settings.socket_path]
    assert "emptyDir" in config.volume_at(settings.socket_path) or "hostPath" in config.volume_at(settings.socket_path)
    assert settings.server.metrics.host in WILDCARD_HOSTS, "the PodMonitor and the liveness probe reach the pod IP"
    assert settings.server.metrics.port == container_port_names(spec)["reorg-metrics"]


@pytest.mark.parametrize(("kustomization", "container"), REORG)
def test_reorg_joins_the_prod_control_plane(kustomization: str, container: str) -> None:
    config = reorg_container(kustomization, container)
    settings = config.load()
    admission = admission_container(CONTROL_PLANE).load()
    namespace = namespace_of(kustomization)
    service, port_name, _ = service_for(settings.admission.target, namespace=namespace, kustomization=CONTROL_PLANE)
    assert (service, port_name) == ("knittrans-admission", "grpc")
    assert settings.job == admission.job, "segments and unit keys are named after the admission service's job"
    token = secret_stand_in("knittrans-admission-token", "token")
    assert settings.admission.token == admission.server.auth.token == token
    store = parse_store_url(settings.store, job=settings.job)
    assert isinstance(store, MooncakeStoreConfig)
    service, port_name, _ = service_for(store.master_address, namespace=namespace, kustomization=CONTROL_PLANE)
    assert (service, port_name) == ("knittrans-mooncake-master", "rpc")
    assert store.local_hostname == POD_IP, "Mooncake peers must reach the sidecar at its pod IP"
    tls = settings.admission.tls
    assert admission.server.tls.client_ca_file and tls.ca_file and tls.cert_file, "the control plane requires mTLS"
    for path in (tls.ca_file, tls.cert_file, tls.key_file):
        assert_secret_file(config, path, "knittrans-admission-client-tls")
    assert settings.dp_rank < admission.topology.backbone.dp and settings.cp_rank < admission.topology.backbone.cp


@pytest.mark.parametrize("kustomization", ["examples/trainer-job", "examples/trainer-statefulset"])
def test_trainer_examples_run_one_pod_per_dp_rank_of_the_admission_topology(kustomization: str) -> None:
    (template,) = pod_templates(render(kustomization))
    spec = template.workload["spec"]
    pods = spec["completions"] if template.workload["kind"] == "Job" else spec["replicas"]
    backbone = admission_container(CONTROL_PLANE).load().topology.backbone
    assert backbone.cp == 1, "one sidecar per pod serves one (DP rank, CP rank) group"
    assert pods == backbone.dp


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_knittrans_pods_get_no_service_link_variables(kustomization: str) -> None:
    """Kubernetes would set KNITTRANS_ADMISSION_SERVICE_HOST and the like for Services named knittrans-*."""
    for template in pod_templates(render(kustomization)):
        images = {str(c.get("image", "")).rsplit("/", 1)[-1].split(":")[0] for c in template.containers()}
        if images & {"knittrans", "knittrans-trainer"}:
            assert template.spec.get("enableServiceLinks") is False, template.name


def test_a_service_link_variable_would_stop_the_service() -> None:
    config = admission_container("overlays/dev")
    with pytest.raises(ConfigError, match="unknown key"):
        config.load(env={"KNITTRANS_ADMISSION_SERVICE_HOST": "10.96.0.10"})


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"KNITTRANS_AUTH__TOKEN": "t"}, "auth"),  # the token outside `server`
        ({"KNITTRANS_TLS__CA_FILE": "/etc/ca.crt"}, "tls"),
        ({"KNITTRANS_SERVER__TLS__CA_FILE": "/etc/ca.crt"}, "server.tls.ca_file"),
        ({"KNITTRANS_METRICS__PORT": "9464"}, "metrics"),
    ],
)
def test_the_keys_the_manifests_used_to_guess_are_rejected(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        admission_container("overlays/dev").load(env=env)
    assert info.value.field == field


def test_a_config_map_key_the_service_does_not_know_is_rejected() -> None:
    config = admission_container("overlays/dev")
    drifted = ContainerConfig(
        where=config.where, command=config.command, args=config.args, env=config.env,
        config_path=config.config_path, config_text=config.config_text + "metrics:\n  port: 9464\n",
        mounts=config.mounts,
    )
    with pytest.raises(ConfigError) as info:
        drifted.load()
    assert info.value.field == "metrics"


def test_stand_ins_are_used_only_for_secrets_that_are_not_rendered() -> None:
    objects = render("overlays/dev")
    assert only(objects, "Secret")["metadata"]["name"].startswith("knittrans-admission-token")
    env = admission_container("overlays/dev").env
    assert env["KNITTRANS_SERVER__AUTH__TOKEN"] == "knittrans-dev-token-not-a-secret"
