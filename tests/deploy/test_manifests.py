"""Every kustomization renders, and every object it renders validates against a schema."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import yaml

from tests.deploy.k8s_objects import only
from tests.deploy.manifest_validation import ManifestError, UnvalidatedKind, describe, validate_object
from tests.deploy.tools import KUSTOMIZATIONS, render, run, venv_tool


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_kustomization_renders_uniquely_named_objects(kustomization: str) -> None:
    objects = render(kustomization)
    assert objects, f"{kustomization} rendered nothing"
    identities = Counter(
        (o["apiVersion"], o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects
    )
    duplicates = [identity for identity, count in identities.items() if count > 1]
    assert not duplicates, f"{kustomization} renders duplicates: {duplicates}"


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_object_validates_against_its_schema(kustomization: str) -> None:
    failures = []
    validators = Counter()
    for obj in render(kustomization):
        try:
            validators[validate_object(obj)] += 1
        except ManifestError as exc:
            failures.append(str(exc))
    assert not failures, "\n".join(failures)
    assert validators["kubernetes"] > 0


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_kubernetes_validate_cli_strict_passes_every_core_object(kustomization, tmp_path) -> None:
    core = [o for o in render(kustomization) if not o["apiVersion"].startswith("monitoring.coreos.com/")]
    manifest = tmp_path / "core.yaml"
    manifest.write_text(yaml.safe_dump_all(core))
    result = run([venv_tool("kubernetes-validate"), "--strict", manifest])
    assert result.returncode == 0, result.stdout + result.stderr
    # The CLI only warns about a kind it has no schema for; here every object must have passed.
    passed = [line for line in result.stdout.splitlines() if line.startswith("INFO") and " passed " in line]
    assert len(passed) == len(core), result.stdout


def test_an_object_of_unknown_kind_fails_validation() -> None:
    crd_object = {"apiVersion": "example.com/v1", "kind": "TrainingJob", "metadata": {"name": "x"}, "spec": {}}
    with pytest.raises(UnvalidatedKind, match="TrainingJob"):
        validate_object(crd_object)


def test_an_unknown_field_in_a_core_object_fails_validation() -> None:
    deployment = copy.deepcopy(only(render("overlays/dev"), "Deployment", "knittrans-admission"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpcc"] = {"port": 50051}
    with pytest.raises(ManifestError, match="grpcc"):
        validate_object(deployment)


def test_an_unknown_field_in_a_prometheus_operator_object_fails_validation() -> None:
    monitor = copy.deepcopy(only(render("overlays/dev"), "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["scrapeEvery"] = "15s"
    with pytest.raises(ManifestError, match="scrapeEvery"):
        validate_object(monitor)


def test_an_invalid_value_in_a_prometheus_operator_object_fails_validation() -> None:
    monitor = copy.deepcopy(only(render("overlays/dev"), "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["interval"] = "15 seconds"
    with pytest.raises(ManifestError, match="interval"):
        validate_object(monitor)


@pytest.mark.parametrize(("overlay", "namespace"), [("overlays/dev", "knittrans-dev"), ("overlays/prod", "knittrans")])
def test_overlay_puts_everything_in_its_one_namespace(overlay: str, namespace: str) -> None:
    objects = render(overlay)
    assert only(objects, "Namespace")["metadata"]["name"] == namespace
    elsewhere = [
        describe(o) for o in objects if o["kind"] != "Namespace" and o["metadata"].get("namespace") != namespace
    ]
    assert not elsewhere, f"objects outside {namespace}: {elsewhere}"


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_images_carry_an_explicit_tag(kustomization: str) -> None:
    images = [
        c["image"]
        for o in render(kustomization)
        if o["kind"] in {"Deployment", "StatefulSet", "DaemonSet", "Job"}
        for c in [
            *o["spec"]["template"]["spec"].get("initContainers", []),
            *o["spec"]["template"]["spec"]["containers"],
        ]
    ]
    assert images
    untagged = [i for i in images if ":" not in i.rsplit("/", 1)[-1] or i.endswith(":latest")]
    assert not untagged, f"images without a pinned tag: {untagged}"
