"""The engine's backends and the rule that picks one for each sandbox.

``backend = auto`` (the default) means the VM where KVM works, since a VM is the stronger
boundary and KVM runs it at native speed, and the container backend otherwise, since under
TCG a VM runs code 17-154x slower than the host; the VM under TCG only if containers cannot
run here. A template may name its backend and a sandbox's create request may too; a snapshot
restores on the backend that took it, a fork on its parent's. ``allow_container = False``
refuses container isolation for those who need the VM boundary.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Protocol

from sandfork.backends.base import Backend
from sandfork.engine.errors import ApiError, BadRequest

log = logging.getLogger(__name__)

CHOICES = ("auto", "vm", "container")


def pick(preference: str, kvm: bool, reasons: dict[str, str | None]) -> tuple[str, str]:
    """The default backend and why, given the preference, whether KVM works, and why each
    backend cannot run (``None``: it can); ``ValueError`` if none can."""
    usable = {name for name, reason in reasons.items() if reason is None}
    if preference in ("vm", "container"):
        if preference not in usable:
            why = reasons.get(preference, "not part of this engine")
            raise ValueError(f"the {preference} backend cannot run here: {why}")
        return preference, f"configured: backend = {preference}"
    if "vm" in usable and kvm:
        return "vm", "KVM works here: VMs run at native speed"
    if "container" in usable:
        return "container", (
            "no working KVM: containers run at native speed where a TCG VM is 17-154x slower"
        )
    if "vm" in usable:
        return "vm", f"no working KVM and no containers ({reasons.get('container')}): VMs under TCG"
    raise ValueError(
        "no backend can run sandboxes here: " + "; ".join(f"{k}: {v}" for k, v in reasons.items())
    )


class _HasBackend(Protocol):
    backend: str


class Backends:
    """The backends one engine runs sandboxes on, by name."""

    def __init__(self, backends: dict[str, Backend], preference: str, allow_container: bool):
        self._all = backends
        self.allow_container = allow_container
        self.reasons = {name: b.unavailable() for name, b in backends.items()}
        if not allow_container:
            self.reasons["container"] = "refused by this engine's allow_container = False"
        self.default, self.why = self._pick(preference)
        log.info("sandboxes run on the %s backend by default: %s", self.default, self.why)

    def _usable(self, name: str) -> bool:
        return name in self._all and self.reasons.get(name) is None

    def _pick(self, preference: str) -> tuple[str, str]:
        vm = self._all.get("vm")
        kvm = vm is not None and vm.accelerator == "kvm"
        return pick(preference, kvm, {n: self.reasons.get(n) for n in self._all})

    def __getitem__(self, name: str) -> Backend:
        backend = self._all.get(name)
        if backend is None:
            raise ApiError(f"this engine has no {name!r} backend", 409)
        return backend

    def of(self, record: _HasBackend) -> Backend:
        """The backend a sandbox or snapshot record belongs to."""
        return self[record.backend]

    def all(self) -> dict[str, Backend]:
        """Every backend, by name."""
        return dict(self._all)

    def choose(self, name: str | None, *, host_access: bool = False) -> Backend:
        """The backend to run a sandbox on: ``name`` (``auto``/``None``: the default), or a
        clear 4xx saying why it cannot be."""
        wanted = self.default if name in (None, "auto") else name
        if wanted not in CHOICES[1:]:
            raise BadRequest(f"backend must be one of {', '.join(CHOICES)}, not {name!r}")
        if not self._usable(wanted):
            raise ApiError(f"the {wanted} backend cannot run here: {self.reasons.get(wanted)}", 409)
        if host_access and wanted == "container":
            raise BadRequest(
                "host_access needs the vm backend: a container sandbox's network is its own "
                "loopback"
            )
        return self._all[wanted]

    def sweep(self, root: Path, keep: set[str]) -> list[str]:
        """Every backend's sweep, then the sandbox folders none of them claimed."""
        gone = []
        for backend in self._all.values():
            gone += backend.sweep(root, keep)
        for directory in list(root.iterdir()) if root.exists() else []:
            if directory.name not in keep:
                shutil.rmtree(directory, ignore_errors=True)
                gone.append(f"directory {directory}")
        return gone
