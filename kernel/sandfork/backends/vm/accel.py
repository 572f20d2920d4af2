"""Choosing QEMU's accelerator: KVM where it really works, TCG otherwise."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Accelerator:
    """The accelerator to run VMs with, and why it was chosen."""

    name: str  # "kvm" or "tcg"
    reason: str

    def qemu_args(self) -> list[str]:
        """QEMU arguments selecting this accelerator and a matching CPU model."""
        if self.name == "kvm":
            return ["-accel", "kvm", "-cpu", "host"]
        return ["-accel", "tcg,thread=multi,tb-size=256", "-cpu", "max"]


def detect_accelerator(preference: str = "auto") -> Accelerator:
    """Pick ``kvm`` or ``tcg``; ``preference`` is "auto", "kvm" or "tcg".

    ``/dev/kvm`` is not proof that KVM works: under PVM (module ``kvm_pvm``, a
    paravirtualized KVM for nested clouds) a stock guest kernel hangs right after
    "Probing EDD", so "auto" treats PVM as no KVM.
    """
    if preference == "tcg":
        return Accelerator("tcg", "configured: accelerator = tcg")
    kvm = Path("/dev/kvm")
    if preference == "kvm":
        return Accelerator("kvm", "configured: accelerator = kvm")
    if preference != "auto":
        raise ValueError(f"accelerator must be auto, kvm or tcg, not {preference!r}")
    if not kvm.exists():
        return Accelerator("tcg", "/dev/kvm does not exist: software emulation (TCG)")
    if not os.access(kvm, os.R_OK | os.W_OK):
        return Accelerator("tcg", "/dev/kvm is not accessible to this user: TCG")
    if Path("/sys/module/kvm_pvm").exists():
        return Accelerator(
            "tcg", "/dev/kvm is PVM (module kvm_pvm), which cannot boot a stock kernel: TCG"
        )
    return Accelerator("kvm", "/dev/kvm is available: hardware virtualization (KVM)")
