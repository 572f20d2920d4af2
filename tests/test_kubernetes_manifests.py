"""The Kubernetes deployment (``deploy/``), checked offline: every object against the
Kubernetes schemas, and what no schema knows: pinned images, limits, nothing exposed outside
the cluster, ``sandfork serve``/``gateway`` options that exist, variables, Secrets and
ConfigMaps that resolve, the gateway's config file, the two engine variants, and the
notebooks' connection to the gateway (docs/kubernetes.md)."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any
from unittest import mock

import kubernetes_validate
import pytest
from traitlets.config import Application, Configurable

from kubernetes_manifests import (
    HUB_VALUES,
    KUSTOMIZATION,
    SECRET_EXAMPLE,
    Doc,
    all_containers,
    applied,
    containers,
    hub_env,
    hub_values,
    invocation,
    kustomization,
    manifest_files,
    manifests,
    objects_of,
    references,
    resolve_env,
    workloads,
    yaml_files,
)
from sandfork import paths
from sandfork.client.connection import Connection, from_environment
from sandfork.config_checks import unknown_settings
from sandfork.engine.cli import ENV_PREFIXES, SandforkEngineApp, env_name
from sandfork.engine.config import EngineConfig
from sandfork.gateway.cli import SandforkGatewayApp
from sandfork.gateway.config import GatewayConfig

KUBERNETES_VERSION = "1.30"
"""The oldest Kubernetes the manifests are for (its schemas ship in kubernetes-validate)."""

APPS: dict[str, tuple[type[Application], type[Configurable]]] = {
    "serve": (SandforkEngineApp, EngineConfig),
    "gateway": (SandforkGatewayApp, GatewayConfig),
}

EXPOSED_BECAUSE = "sandfork.dev/exposed-because"
"""The annotation a LoadBalancer or NodePort Service needs: why it is reachable from outside
the cluster."""

VARIANT_DIFFERENCES = (
    ("metadata", "name"),
    ("metadata", "labels", "sandfork.dev/backend"),
    ("spec", "selector", "matchLabels", "sandfork.dev/backend"),
    ("spec", "template", "metadata", "labels", "sandfork.dev/backend"),
    ("spec", "template", "spec", "nodeSelector"),
    ("spec", "template", "spec", "securityContext"),
    ("spec", "template", "spec", "initContainers"),  # the VM engine's hostPath owner
)
"""Where the VM and the container engine may differ in their DaemonSets (docs/kubernetes.md,
"The two engines"); inside the engine's container, :data:`ENGINE_DIFFERENCES`."""

ENGINE_DIFFERENCES = ("command", "securityContext", "args", "resources")
BACKEND_OPTIONS = (
    "--EngineConfig.backend=",
    "--EngineConfig.allow_container=",
    "--EngineConfig.accelerator=",
)
KVM = "squat.ai/kvm"


def _ids(docs: list[Doc]) -> list[str]:
    return [str(d) for d in docs]


def _ref(name: str, key: str | None) -> str:
    return f"{name}:{key}" if key else name


# -- files ---------------------------------------------------------------------------------


def test_every_yaml_file_is_checked_and_applied() -> None:
    """Each YAML file is a manifest, the kustomization or the JupyterHub values; the
    kustomization applies every manifest file but the Secrets' template."""
    assert set(yaml_files()) == {*manifest_files(), KUSTOMIZATION, HUB_VALUES}
    listed = {KUSTOMIZATION.parent / name for name in kustomization()["resources"]}
    assert listed == set(manifest_files()) - {SECRET_EXAMPLE}


@pytest.mark.parametrize("doc", manifests(), ids=_ids(manifests()))
def test_manifest_matches_the_kubernetes_schema(doc: Doc) -> None:
    """Strict: an unknown field fails as a wrong type does (schemas bundled: offline)."""
    kubernetes_validate.validate(doc.body, KUBERNETES_VERSION, strict=True)


# -- what a schema does not check ----------------------------------------------------------


def _images() -> list[tuple[str, str]]:
    found = [(f"{d} {c['name']}", str(c["image"])) for d, c in all_containers()]
    image = hub_values()["singleuser"]["image"]
    found.append((str(HUB_VALUES.name), f"{image['name']}:{image['tag']}"))
    return found


@pytest.mark.parametrize(("where", "image"), _images())
def test_image_is_pinned(where: str, image: str) -> None:
    """A tag other than ``latest``, or a digest (no tag means ``latest``)."""
    if "@" in image:
        return
    name, _, tag = image.rpartition(":")
    assert name and "/" not in tag, f"{where}: {image} has no tag (latest)"
    assert tag != "latest", f"{where}: {image}"


def test_every_container_has_limits() -> None:
    """CPU and memory limits on every container, the notebooks' too."""
    for doc, container in all_containers():
        limits = container.get("resources", {}).get("limits", {})
        assert {"cpu", "memory"} <= set(limits), f"{doc} {container['name']}: {limits}"
    singleuser = hub_values()["singleuser"]
    assert singleuser["cpu"]["limit"] and singleuser["memory"]["limit"]


def test_no_service_is_reachable_from_outside_unless_said_why() -> None:
    """Services are ClusterIP (headless too) unless annotated with :data:`EXPOSED_BECAUSE`."""
    for doc in applied():
        if doc.kind == "Service" and doc.body["spec"].get("type", "ClusterIP") != "ClusterIP":
            why = doc.body["metadata"].get("annotations", {}).get(EXPOSED_BECAUSE, "")
            assert why.strip(), f"{doc} is {doc.body['spec']['type']} without {EXPOSED_BECAUSE}"


def test_nothing_is_reached_from_outside_the_namespace() -> None:
    """A default deny of ingress, and each policy admits named pods only (no address
    blocks, no other namespaces, no rule open to all)."""
    policies = [d.body["spec"] for d in applied() if d.kind == "NetworkPolicy"]
    assert {"podSelector": {}, "policyTypes": ["Ingress"]} in policies
    for policy in policies:
        for rule in policy.get("ingress", []):
            peers = rule.get("from", [])
            assert peers and all(set(p) == {"podSelector"} for p in peers), policy


# -- what the containers run ---------------------------------------------------------------


def _invocations() -> list[tuple[str, str, list[str]]]:
    return [(f"{d} {c['name']}", *found) for d, c in all_containers() if (found := invocation(c))]


def test_the_fleet_runs_two_engines_and_a_gateway() -> None:
    """What the option checks below go through (so a changed command cannot skip them)."""
    assert sorted(sub for _, sub, _ in _invocations()) == ["gateway", "serve", "serve"]


@pytest.mark.parametrize(("where", "subcommand", "args"), _invocations())
def test_sandfork_options_are_real(where: str, subcommand: str, args: list[str]) -> None:
    """Each argument, parsed by the real application, sets settings it has (the check the
    engine and the gateway make at start), and all of them make a valid configuration."""
    app_class, config_class = APPS[subcommand]
    for arg in args:
        app = app_class()
        app.parse_command_line([arg])
        assert app.cli_config, f"{where}: {arg} sets nothing"
        assert unknown_settings(app) is None, f"{where}: {arg}: {unknown_settings(app)}"
    app = app_class()
    app.parse_command_line(args)
    config_class(parent=app)  # a TraitError for a value the setting refuses


def test_variables_in_commands_and_env_are_defined() -> None:
    """Kubernetes leaves an undefined ``$(NAME)`` as it is: each must name a variable of
    the container (in ``env``, one defined above it)."""
    for doc, container in all_containers():
        defined: list[str] = []
        for var in container.get("env", []):
            for name in references(str(var.get("value", ""))):
                assert name in defined, f"{doc} {var['name']}: $({name}) is not defined above"
            defined.append(var["name"])
        for word in [*container.get("command", []), *container.get("args", [])]:
            for name in references(word):
                assert name in defined, f"{doc} {container['name']}: $({name}) is not defined"


def _names_a_path(name: str) -> bool:
    """Whether ``sandfork.paths`` reads the variable ``name``."""
    marker = "/k8s-test-marker"
    functions = (paths.cache_dir, paths.config_dir, paths.state_dir, paths.user_templates_dir)
    with mock.patch.dict(os.environ, {name: marker}):
        return any(str(f()) == marker for f in functions)


def test_engine_environment_is_made_of_settings() -> None:
    """An engine's ``SANDFORK_*`` variables are settings (``SANDFORK_<NAME>``,
    ``SANDFORK_S3_<NAME>``) or folders."""
    settings = {
        env_name(name, cls) for cls in ENV_PREFIXES for name in cls.class_traits(config=True)
    }
    for doc, container in all_containers():
        found = invocation(container)
        if found is None or found[0] != "serve":
            continue
        for var in container.get("env", []):
            name = var["name"]
            if name.startswith("SANDFORK_"):
                assert name in settings or _names_a_path(name), f"{doc}: {name} is read by none"


# -- Secrets and ConfigMaps ----------------------------------------------------------------


def _wanted(spec: dict[str, Any], kind: str) -> set[str]:
    """The ``name:key`` (or ``name``) of each object of ``kind`` a pod spec uses."""
    ref_key, env_from_key, volume_key = {
        "Secret": ("secretKeyRef", "secretRef", "secret"),
        "ConfigMap": ("configMapKeyRef", "configMapRef", "configMap"),
    }[kind]
    wanted: set[str] = set()
    for container in containers(spec):
        for var in container.get("env", []):
            ref = var.get("valueFrom", {}).get(ref_key)
            if ref:
                wanted.add(_ref(ref["name"], ref["key"]))
        for source in container.get("envFrom", []):
            if env_from_key in source:
                wanted.add(source[env_from_key]["name"])
    for volume in spec.get("volumes", []):
        source = volume.get(volume_key)
        if source:
            name = source.get("secretName") or source["name"]
            keys = [item["key"] for item in source.get("items", [])] or [None]
            wanted.update(_ref(name, key) for key in keys)
    return wanted


@pytest.mark.parametrize(("kind", "where"), [("Secret", SECRET_EXAMPLE), ("ConfigMap", None)])
def test_referenced_objects_exist(kind: str, where: Path | None) -> None:
    """Each Secret (and key) the pods or the notebooks use is in the Secrets' template; each
    ConfigMap (and key) in the manifests."""
    docs = [d for d in manifests() if d.path == where] if where else applied()
    have: set[str] = set()
    for name, body in objects_of(kind, docs).items():
        have.add(name)
        have.update(
            _ref(name, key) for key in {**body.get("data", {}), **body.get("stringData", {})}
        )
    wanted = set().union(*(_wanted(spec, kind) for _, spec in workloads()))
    wanted |= _wanted({"containers": [{"env": hub_env()}]}, kind)
    assert wanted, f"no {kind} is used: the check would check nothing"
    assert wanted <= have, f"{kind}s used but not defined: {sorted(wanted - have)}"


# -- the gateway's config file, the two engines, the notebooks -------------------------------


def _workload(name: str) -> tuple[Doc, dict[str, Any]]:
    (found,) = [(d, spec) for d, spec in workloads() if d.name == name]
    return found


def test_gateway_config_file_gives_its_keys(tmp_path: Path) -> None:
    """The gateway's ``--config`` names the file its ConfigMap mounts, and that file, with
    the container's environment, gives the clients' key and every listed engine its key."""
    _, spec = _workload("sandfork-gateway")
    (container,) = spec["containers"]
    _, args = invocation(container) or ("", [])
    (config_arg,) = [a for a in args if a.startswith("--config=")]
    config_path = Path(config_arg.removeprefix("--config="))
    (mount,) = [m for m in container["volumeMounts"] if config_path.parent == Path(m["mountPath"])]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    (item,) = [i for i in volume["configMap"]["items"] if i["path"] == config_path.name]
    config_map = objects_of("ConfigMap", applied())[volume["configMap"]["name"]]
    local = tmp_path / config_path.name
    local.write_text(config_map["data"][item["key"]])
    env = resolve_env(container["env"])
    environment = {**env, "SANDFORK_CONFIG_DIR": str(tmp_path / "no-config")}
    with mock.patch.dict(os.environ, environment, clear=True):
        app = SandforkGatewayApp()
        app.initialize([f"--config={local}" if a == config_arg else a for a in args])
        config = GatewayConfig(parent=app)
    assert config.api_key == env["GATEWAY_CLIENT_KEY"]
    names = env["GATEWAY_ENGINE_NAMES"].split()
    assert names and config.engine_keys == dict.fromkeys(names, env["GATEWAY_ENGINE_KEY"])


def _without(body: dict[str, Any], path: tuple[str, ...]) -> None:
    *parents, last = path
    for part in parents:
        body = body.get(part, {})
    body.pop(last, None)


def _engine_core(name: str) -> dict[str, Any]:
    """An engine DaemonSet less :data:`VARIANT_DIFFERENCES` and, in its container, less
    :data:`ENGINE_DIFFERENCES` but for the arguments and resources they share."""
    doc, _ = _workload(name)
    body = copy.deepcopy(doc.body)
    for path in VARIANT_DIFFERENCES:
        _without(body, path)
    (engine,) = body["spec"]["template"]["spec"]["containers"]
    _, args = invocation(engine) or ("", [])
    shared_args = [a for a in args if not a.startswith(BACKEND_OPTIONS)]
    resources = engine.get("resources", {})
    shared_resources = {k: {r: v for r, v in q.items() if r != KVM} for k, q in resources.items()}
    for key in ENGINE_DIFFERENCES:
        engine.pop(key, None)
    return {**body, "args": shared_args, "resources": shared_resources}


def test_engine_variants_differ_only_where_documented() -> None:
    """The VM and the container DaemonSets are one pod but for the listed places, so a
    setting added to one is not forgotten in the other."""
    assert _engine_core("sandfork-engine-vm") == _engine_core("sandfork-engine-container")


def test_notebooks_reach_the_gateway_with_its_client_key() -> None:
    """The notebooks' variables are the ones the client reads, pointing at the gateway's
    Service with the key the gateway takes from the same Secret."""
    env = resolve_env(hub_env())
    with mock.patch.dict(os.environ, env, clear=True):
        connection = from_environment()
    (service,) = [d for d in applied() if d.kind == "Service" and d.name == "sandfork-gateway"]
    (port,) = service.body["spec"]["ports"]
    namespace = kustomization()["namespace"]
    url = f"http://{service.name}.{namespace}.svc.cluster.local:{port['port']}"
    _, gateway = _workload("sandfork-gateway")
    client_key = resolve_env(gateway["containers"][0]["env"])["GATEWAY_CLIENT_KEY"]
    assert connection == Connection(url, client_key)
