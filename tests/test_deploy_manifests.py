"""Tests of the Kubernetes manifests in ``deploy/k8s/``, without a cluster.

Two kinds of checks:

- **schema**: every object validates against the Kubernetes OpenAPI schemas that the
  ``kubernetes-validate`` package (PyPI) ships offline, in strict mode (an unknown or misspelt field
  fails), for the oldest Kubernetes the manifests claim (1.27: native gRPC probes) and the newest
  schema the package has;
- **semantics** a schema cannot see: the containers' args parse with our own CLI parser
  (``dataservice.cli.build_parser``) and build valid configs, probes ask the ports the servers listen
  on for service names a real dispatcher and worker report SERVING, the token file the environment
  names is where the Secret is mounted, the Services select the pods, and the autoscaler reads
  ``dataservice_recommended_workers`` through the Prometheus adapter's rule.

What is not run here: ``kubectl apply``/``kustomize build`` and the pods themselves (no cluster).

Example::

    $ python -m pytest tests/test_deploy_manifests.py
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from kubernetes_validate import utils as k8s_validate

from dataservice import cli
from dataservice.service.auth import TOKEN_ENV, TOKEN_FILE_ENV
from dataservice.service.dispatcher_client import DISPATCHER_SERVICE, WORKER_SERVICE
from dataservice.service.health_probe import check_health
from tests.cluster import TestCluster

K8S = Path(__file__).resolve().parent.parent / "deploy" / "k8s"
#: The oldest Kubernetes the manifests are for (gRPC probes are stable from 1.27), and the newest the
#: validator has schemas of.
K8S_VERSIONS = ("1.27.0", k8s_validate.latest_version())
METRIC = "dataservice_recommended_workers"
#: What Kubernetes substitutes for $(POD_IP) here: any pod IP.
POD_IP = "10.42.0.17"
#: Files of deploy/k8s that are snippets for the monitoring stack, not resources of the kustomization.
MONITORING_SNIPPETS = ("prometheus-adapter-rules.yaml", "prometheus-scrape-config.yaml")


def _documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


@pytest.fixture(scope="module")
def kustomization() -> dict:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


@pytest.fixture(scope="module")
def objects(kustomization) -> dict[tuple[str, str], dict]:
    """The kustomization's objects by (kind, name)."""
    found = {}
    for resource in kustomization["resources"]:
        for doc in _documents(K8S / resource):
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in found, f"{key} defined twice"
            found[key] = doc
    return found


def generated_secret(kustomization: dict) -> dict:
    """The Secret the kustomization's secretGenerator makes (before kustomize adds its hash suffix)."""
    (generator,) = kustomization["secretGenerator"]
    keys = [entry.partition("=")[0] for entry in generator["files"]]
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": generator["name"], "namespace": kustomization["namespace"]},
            "data": {key: "YS10b2tlbi1vZi1hdC1sZWFzdC0xNi1jaGFycw==" for key in keys}}


def every_manifest() -> Iterator[tuple[str, dict]]:
    for path in sorted(K8S.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            for doc in _documents(path):
                yield f"{path.name}: {doc['kind']}/{doc['metadata']['name']}", doc


def container(obj: dict) -> dict:
    (only,) = obj["spec"]["template"]["spec"]["containers"]
    return only


def expand(args: list[str], env: list[dict]) -> list[str]:
    """The args as Kubernetes hands them to the container: $(VAR) replaced by the env var's value (a
    downward-API field here gets a plausible value). An undefined $(VAR) would stay literal: refused."""
    values = {}
    for var in env:
        if "value" in var:
            values[var["name"]] = var["value"]
        elif var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            values[var["name"]] = POD_IP
    out = []
    for arg in args:
        for name in re.findall(r"\$\((\w+)\)", arg):
            assert name in values, f"$({name}) in {arg!r} is not defined in the container's env"
        out.append(re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], arg))
    return out


def parse(obj: dict, monkeypatch, tmp_path: Path):
    """The container's command line parsed by ``dataservice``'s parser, with the token file the pod
    would have (servers on 0.0.0.0 need it)."""
    spec = container(obj)
    env = {var["name"]: var.get("value") for var in spec.get("env", [])}
    token = tmp_path / "token"
    token.write_text("a-test-token-for-the-manifests\n")
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.setenv(TOKEN_FILE_ENV, str(token))
    assert env.get(TOKEN_FILE_ENV), f"{obj['metadata']['name']} does not set {TOKEN_FILE_ENV}"
    argv = expand(spec["args"], spec.get("env", []))
    assert "command" not in spec, "the image's ENTRYPOINT (dataservice) runs the args"
    try:
        return cli.build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"{obj['metadata']['name']}: {argv} does not parse with `dataservice`")


def port_numbers(spec: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in spec["ports"]}


# --- schema -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_manifest_validates(version, kustomization) -> None:
    manifests = list(every_manifest()) + [("the secretGenerator's Secret", generated_secret(kustomization))]
    assert len(manifests) >= 9
    for where, doc in manifests:
        try:
            k8s_validate.validate(doc, version, strict=True)
        except k8s_validate.ValidationError as exc:
            pytest.fail(f"{where} is not a valid Kubernetes {version} object: {exc.message} at "
                        f"{'/'.join(str(p) for p in exc.absolute_path)}")


def test_the_validator_catches_mistakes(objects) -> None:
    """The schema check has teeth: a misspelt field and a probe port of the wrong type both fail."""
    worker = copy.deepcopy(objects["Deployment", "dataservice-worker"])
    container(worker)["readinessProbe"]["grpc"]["prot"] = 5051
    with pytest.raises(k8s_validate.ValidationError):
        k8s_validate.validate(worker, K8S_VERSIONS[0], strict=True)
    worker = copy.deepcopy(objects["Deployment", "dataservice-worker"])
    container(worker)["livenessProbe"]["grpc"]["port"] = "grpc"  # grpc probes take a number, not a name
    with pytest.raises(k8s_validate.ValidationError):
        k8s_validate.validate(worker, K8S_VERSIONS[0], strict=True)


def test_the_kustomization_lists_every_resource(kustomization) -> None:
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and kustomization["kind"] == "Kustomization"
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files - set(MONITORING_SNIPPETS)
    (namespace,) = _documents(K8S / "namespace.yaml")
    assert namespace["metadata"]["name"] == kustomization["namespace"]
    # The token file the generator reads is never committed.
    (generator,) = kustomization["secretGenerator"]
    assert generator["files"] == ["token=auth_token"]
    assert "auth_token" in (K8S / ".gitignore").read_text().split()


# --- the dispatcher ------------------------------------------------------------------------------------------

def test_dispatcher_statefulset(objects, monkeypatch, tmp_path) -> None:
    sts = objects["StatefulSet", "dataservice-dispatcher"]
    assert sts["spec"]["replicas"] == 1
    args = parse(sts, monkeypatch, tmp_path)
    config = cli.dispatcher_config(args)  # semantic checks too (--fault-tolerant needs --work-dir)
    assert args.command == "dispatcher" and config.fault_tolerant_mode and args.host == "0.0.0.0"
    spec = container(sts)
    # work_dir is on the claim template's volume.
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in spec["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == config.work_dir
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    ports = port_numbers(spec)
    assert ports["grpc"] == args.port and ports["http"] == args.http_port
    annotations = sts["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and int(annotations["prometheus.io/port"]) == args.http_port
    # The governing Service of the StatefulSet is headless; the ClusterIP one is what workers dial.
    governing = objects["Service", sts["spec"]["serviceName"]]
    assert governing["spec"]["clusterIP"] == "None"
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    for service in (governing, objects["Service", "dataservice-dispatcher"]):
        assert service["spec"]["selector"].items() <= pod_labels.items()
        for port in service["spec"]["ports"]:
            assert ports[port["targetPort"]] == port["port"]


def test_workers_dial_the_dispatcher_service(objects, monkeypatch, tmp_path) -> None:
    worker = objects["Deployment", "dataservice-worker"]
    args = parse(worker, monkeypatch, tmp_path)
    config = cli.worker_config(args)
    host, port = config.dispatcher_address.rsplit(":", 1)
    service = objects["Service", host]
    assert service["spec"]["type"] == "ClusterIP"
    assert int(port) in [p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc"]


def test_workers_advertise_their_pod_ip(objects, monkeypatch, tmp_path) -> None:
    worker = objects["Deployment", "dataservice-worker"]
    spec = container(worker)
    (pod_ip,) = [v for v in spec["env"] if v["name"] == "POD_IP"]
    assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert "$(POD_IP):5051" in spec["args"]
    args = parse(worker, monkeypatch, tmp_path)
    config = cli.worker_config(args)
    assert args.command == "worker" and args.host == "0.0.0.0"
    assert config.worker_address == f"{POD_IP}:{args.port}"
    ports = port_numbers(spec)
    assert ports["grpc"] == args.port and ports["data"] == args.data_transfer_port and ports["http"] == args.http_port
    assert args.data_transfer_protocol == "tcp"
    annotations = worker["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == args.http_port
    # A budget below the container's memory limit: the default is a quarter of the node's memory.
    limit = spec["resources"]["limits"]["memory"]
    assert limit.endswith("Gi") and args.memory_budget_bytes < int(limit[:-2]) * 2**30


# --- probes and the token -----------------------------------------------------------------------------------

SERVER_SERVICES = {"dataservice-dispatcher": DISPATCHER_SERVICE, "dataservice-worker": WORKER_SERVICE}


def _servers(objects) -> list[dict]:
    return [objects["StatefulSet", "dataservice-dispatcher"], objects["Deployment", "dataservice-worker"]]


def test_probes_ask_the_grpc_health_service_on_the_servers_port(objects, monkeypatch, tmp_path) -> None:
    for obj in _servers(objects):
        name = obj["metadata"]["name"]
        spec = container(obj)
        args = parse(obj, monkeypatch, tmp_path)
        assert {"readinessProbe", "livenessProbe"} <= spec.keys(), name
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            if kind not in spec:
                continue
            probe = spec[kind]["grpc"]
            assert probe["port"] == args.port == port_numbers(spec)["grpc"], f"{name} {kind}"
            assert probe["service"] == SERVER_SERVICES[name], f"{name} {kind}"


def test_the_probed_service_names_are_serving_on_real_servers(objects) -> None:
    """What the kubelet asks, asked of a real dispatcher and worker (their ports as the probes' ports)."""
    with TestCluster(num_workers=1) as cluster:
        real_ports = {"dataservice-dispatcher": cluster.port, "dataservice-worker": cluster.workers[0].port}
        for obj in _servers(objects):
            name = obj["metadata"]["name"]
            for kind in ("readinessProbe", "livenessProbe"):
                result = check_health(f"127.0.0.1:{real_ports[name]}", container(obj)[kind]["grpc"]["service"])
                assert result.healthy, f"{name} {kind}: {result.message}"


def test_the_token_file_is_the_mounted_secret(objects, kustomization) -> None:
    secret = generated_secret(kustomization)
    for obj in _servers(objects):
        name = obj["metadata"]["name"]
        spec = container(obj)
        pod = obj["spec"]["template"]["spec"]
        (token_file,) = [v["value"] for v in spec["env"] if v["name"] == TOKEN_FILE_ENV]
        directory, key = os.path.split(token_file)
        (mount,) = [m for m in spec["volumeMounts"] if m["mountPath"] == directory]
        assert mount.get("readOnly") is True, name
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert volume["secret"]["secretName"] == secret["metadata"]["name"], name
        assert key in secret["data"], f"{name}: {token_file} is not a key of the Secret"
        # The image runs as uid 1000: the Secret's file is readable through the fsGroup.
        assert pod["securityContext"]["runAsUser"] == pod["securityContext"]["fsGroup"] == 1000, name
        assert volume["secret"]["defaultMode"] & 0o040, name


# --- autoscaling -----------------------------------------------------------------------------------------------

def test_the_hpa_scales_workers_on_the_recommended_worker_count(objects) -> None:
    hpa = objects["HorizontalPodAutoscaler", "dataservice-worker"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    worker = objects["Deployment", "dataservice-worker"]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": worker["apiVersion"], "kind": worker["kind"],
                                             "name": worker["metadata"]["name"]}
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["metric"]["name"] == METRIC
    # An average of 1 per replica: the desired replicas are the recommendation itself.
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    # The selector names the dispatcher's pods by the label the scrape job copies into "app".
    dispatcher_labels = objects["StatefulSet", "dataservice-dispatcher"]["spec"]["template"]["metadata"]["labels"]
    assert metric["external"]["metric"]["selector"]["matchLabels"] == {
        "app": dispatcher_labels["app.kubernetes.io/name"]}
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]


def test_the_adapter_rule_and_the_scrape_job(kustomization) -> None:
    (adapter,) = _documents(K8S / "prometheus-adapter-rules.yaml")
    config: Any = yaml.safe_load(adapter["data"]["config.yaml"])
    (rule,) = config["externalRules"]
    assert rule["name"]["as"] == METRIC and re.fullmatch(rule["name"]["matches"], METRIC)
    assert rule["seriesQuery"].startswith(METRIC + "{")
    assert rule["resources"]["overrides"]["namespace"] == {"resource": "namespace"}
    assert "<<.Series>>{<<.LabelMatchers>>}" in rule["metricsQuery"]

    (scrape,) = _documents(K8S / "prometheus-scrape-config.yaml")
    (job,) = yaml.safe_load(scrape["data"]["scrape-config.yaml"])["scrape_configs"]
    assert job["kubernetes_sd_configs"][0]["namespaces"]["names"] == [kustomization["namespace"]]
    targets = {r.get("target_label"): r for r in job["relabel_configs"]}
    # The labels the adapter rule and the HPA's selector use.
    assert targets["namespace"]["source_labels"] == ["__meta_kubernetes_namespace"]
    assert targets["app"]["source_labels"] == ["__meta_kubernetes_pod_label_app_kubernetes_io_name"]
    # The port annotation rewrites the address: the regex joins the pod IP and the annotated port.
    rewrite = targets["__address__"]
    joined = ";".join([f"{POD_IP}:5050", "8080"])
    assert re.sub("^(?:" + rewrite["regex"] + ")$", rewrite["replacement"].replace("$", "\\"), joined) == \
        f"{POD_IP}:8080"
