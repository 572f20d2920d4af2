"""Sandbox templates: declarative specs and the images built from them.

A template is a TOML spec (Debian base, apt and pip packages, files, setup commands) that is
built into a guest kernel + initramfs (with the guest agent) and a qcow2 root image, cached
under ``sandfork.paths.cache_dir()``. Root and ordinary users alike can build (see ``userns``);
templates installed for every user are found in read-only folders (``cache.template_roots``),
and ``exchange`` carries a built template to another machine as one verified file::

    from sandfork.templates import ensure_template
    tmpl = ensure_template("code-interpreter")  # builds once (2-3 min), then instant
    tmpl.kernel, tmpl.initrd, tmpl.rootfs, tmpl.cmdline
"""

from .builder import BUILDER_VERSION, BuiltTemplate, ensure_template
from .errors import TemplateError
from .kernel import KERNEL_CMDLINE
from .spec import TemplateSpec, list_specs, load_spec, parse_spec

__all__ = [
    "BUILDER_VERSION",
    "KERNEL_CMDLINE",
    "BuiltTemplate",
    "TemplateError",
    "TemplateSpec",
    "ensure_template",
    "list_specs",
    "load_spec",
    "parse_spec",
]
