"""The deployment files under ``deploy/`` as data: the Kubernetes manifests, the Secrets'
template, the JupyterHub values, and what their pods run (for
``test_kubernetes_manifests.py``)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
KUSTOMIZATION = KUBERNETES / "kustomization.yaml"
SECRET_EXAMPLE = KUBERNETES / "secret.example.yaml"
HUB_VALUES = DEPLOY / "jupyterhub" / "values.yaml"
SUBCOMMANDS = ("serve", "gateway")  # what `sandfork ...` a container may run
_REFERENCE = re.compile(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)")  # $(VAR); $$(VAR) is escaped


@dataclass(frozen=True)
class Doc:
    """One YAML document of a manifest file."""

    path: Path
    index: int
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        """Its ``kind``."""
        return str(self.body["kind"])

    @property
    def name(self) -> str:
        """Its ``metadata.name``."""
        return str(self.body["metadata"]["name"])

    def __str__(self) -> str:
        return f"{self.path.relative_to(DEPLOY)}#{self.index} {self.kind}/{self.name}"


def yaml_files() -> list[Path]:
    """Every YAML file under ``deploy/``."""
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


def load(path: Path) -> list[dict[str, Any]]:
    """The non-empty YAML documents of ``path``."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def manifest_files() -> list[Path]:
    """The files of Kubernetes objects: every YAML file of ``deploy/kubernetes`` but the
    kustomization."""
    return [p for p in yaml_files() if p.parent == KUBERNETES and p != KUSTOMIZATION]


def manifests() -> list[Doc]:
    """Every Kubernetes object of :func:`manifest_files`."""
    return [Doc(p, i, body) for p in manifest_files() for i, body in enumerate(load(p))]


def applied() -> list[Doc]:
    """The objects ``kubectl apply -k`` sends: all but the Secrets' template."""
    return [d for d in manifests() if d.path != SECRET_EXAMPLE]


def kustomization() -> dict[str, Any]:
    """``deploy/kubernetes/kustomization.yaml``."""
    (body,) = load(KUSTOMIZATION)
    return body


def hub_values() -> dict[str, Any]:
    """``deploy/jupyterhub/values.yaml``."""
    (body,) = load(HUB_VALUES)
    return body


def pod_spec(doc: Doc) -> dict[str, Any] | None:
    """The pod template's spec of a workload (None for other kinds)."""
    template = doc.body.get("spec", {}).get("template")
    return template["spec"] if template else None


def workloads() -> list[tuple[Doc, dict[str, Any]]]:
    """The applied workloads with their pod specs."""
    return [(d, spec) for d in applied() if (spec := pod_spec(d)) is not None]


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """A pod spec's containers, init containers included."""
    return [*spec.get("initContainers", []), *spec["containers"]]


def all_containers() -> Iterator[tuple[Doc, dict[str, Any]]]:
    """Every container of every applied workload."""
    for doc, spec in workloads():
        for container in containers(spec):
            yield doc, container


def invocation(container: dict[str, Any]) -> tuple[str, list[str]] | None:
    """``(subcommand, its arguments)`` when the container runs ``sandfork serve`` or
    ``sandfork gateway`` (directly or as a wrapper's ``"$@"``), else None."""
    words = [*container.get("command", []), *container.get("args", [])]
    for i, word in enumerate(words[:-1]):
        if Path(word).name == "sandfork" and words[i + 1] in SUBCOMMANDS:
            return words[i + 1], words[i + 2 :]
    return None


def references(text: str) -> list[str]:
    """The variables ``$(NAME)`` in ``text`` that Kubernetes expands."""
    return _REFERENCE.findall(text)


def hub_env() -> list[dict[str, Any]]:
    """``singleuser.extraEnv`` of the JupyterHub values as a container's ``env`` list."""
    extra = hub_values()["singleuser"]["extraEnv"]
    return [
        {"name": name, **(value if isinstance(value, dict) else {"value": value})}
        for name, value in extra.items()
    ]


def objects_of(kind: str, docs: list[Doc]) -> dict[str, dict[str, Any]]:
    """The objects of ``kind`` in ``docs``, by name."""
    return {d.name: d.body for d in docs if d.kind == kind}


def resolve_env(env: list[dict[str, Any]]) -> dict[str, str]:
    """A container's environment as its pod would see it: values of ConfigMaps from the
    manifests, of Secrets from the template, a placeholder for each field of the downward API,
    and ``$(NAME)`` expanded."""
    config_maps = objects_of("ConfigMap", applied())
    secrets = objects_of("Secret", manifests())
    resolved: dict[str, str] = {}
    for var in env:
        source = var.get("valueFrom")
        if source is None:
            value = str(var.get("value", ""))
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            value = str(secrets[ref["name"]]["stringData"][ref["key"]])
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            value = str(config_maps[ref["name"]]["data"][ref["key"]])
        else:
            value = f"<{source['fieldRef']['fieldPath']}>"
        resolved[var["name"]] = _REFERENCE.sub(lambda m: resolved[m.group(1)], value)
    return resolved
