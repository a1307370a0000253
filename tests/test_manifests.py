"""The Kubernetes manifests against the Kubernetes schemas, offline: `kubernetes-validate` carries the
OpenAPI schemas of each Kubernetes release in the package. The Prometheus Operator's PodMonitor and
ServiceMonitor are custom resources it has no schema for: they are checked against what they select."""

from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from support.procs import REPO

KUBERNETES = "1.30.0"  # the oldest release the manifests promise to apply to
KUBERNETES_DIR = REPO / "deploy" / "kubernetes"
MONITORS = {"PodMonitor", "ServiceMonitor"}


def documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def every_manifest() -> list[tuple[str, dict]]:
    return [
        (f"{path.relative_to(REPO)}:{doc['kind']}/{doc['metadata']['name']}", doc)
        for path in sorted(KUBERNETES_DIR.rglob("*.yaml"))
        for doc in documents(path)
    ]


def validate(doc: dict) -> None:
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)


@pytest.mark.parametrize(
    "where,doc", [m for m in every_manifest() if m[1]["kind"] not in MONITORS], ids=lambda v: v
)
def test_every_manifest_validates_strictly_against_the_kubernetes_schema(where, doc):
    try:
        validate(doc)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{where}: {'.'.join(map(str, exc.path))}: {exc.message}")


def test_the_validation_can_fail():
    """A typo in a field name and a wrong type are both caught (strict mode)."""
    deployment = next(doc for _, doc in every_manifest() if doc["kind"] == "Deployment")
    typo = copy.deepcopy(deployment)
    typo["spec"]["template"]["spec"]["containers"][1]["resource"] = {}
    wrong = copy.deepcopy(deployment)
    wrong["spec"]["replicas"] = "three"
    downward = copy.deepcopy(deployment)
    medic = next(c for c in downward["spec"]["template"]["spec"]["containers"] if c["name"] == "medic")
    medic["env"][-1]["valueFrom"]["resourceFieldRef"]["resourceName"] = "limits.memory"
    for broken in (typo, wrong, downward):
        with pytest.raises(kubernetes_validate.ValidationError):
            validate(broken)


def test_every_kind_shipped_is_known():
    kinds = {doc["kind"] for _, doc in every_manifest()}
    assert kinds == {"Secret", "ConfigMap", "Deployment", "Service", "PodMonitor", "ServiceMonitor"}


def _sidecar() -> dict[str, dict]:
    return {doc["kind"]: doc for doc in documents(KUBERNETES_DIR / "sidecar.yaml")}


def _monitor(kind: str) -> dict:
    (doc,) = [doc for _, doc in every_manifest() if doc["kind"] == kind]
    return doc


def test_the_podmonitor_selects_the_pods_and_the_medic_port():
    sidecar = _sidecar()
    monitor = _monitor("PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor["spec"]) == {"selector", "podMetricsEndpoints"}
    template = sidecar["Deployment"]["spec"]["template"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    medic = next(c for c in template["spec"]["containers"] if c["name"] == "medic")
    assert endpoint["port"] in {p["name"] for p in medic["ports"]}
    assert endpoint["path"] == template["metadata"]["annotations"]["prometheus.io/path"]
    assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout"}


def test_the_servicemonitor_selects_the_service_and_its_port():
    service = _sidecar()["Service"]
    monitor = _monitor("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor["spec"]) == {"selector", "endpoints"}
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout"}


def test_one_scrape_path_is_shipped():
    """The pods carry the annotations; the Service none; each monitor file says to turn them off."""
    sidecar = _sidecar()
    annotations = sidecar["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert not any(
        k.startswith("prometheus.io/") for k in sidecar["Service"]["metadata"].get("annotations", {})
    )
    for name in ("podmonitor.yaml", "servicemonitor.yaml"):
        text = (KUBERNETES_DIR / "monitoring" / name).read_text()
        assert 'prometheus.io/scrape: "false"' in text and "not both" in text, name
