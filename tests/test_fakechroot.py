"""The fakechroot build path's own pieces, on a tree made here: absolute symlinks fakechroot
wrote with the tree's host path in front are made the guest's again, and the tree's library
folders are found as its ``ld.so.conf`` lists them. ``test_binder.py`` builds a whole
template that way, user namespaces refused."""

from __future__ import annotations

import os
from pathlib import Path

from sandfork.templates import fakechroot


def test_symlinks_fakechroot_prefixed_point_into_the_guest_again(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "usr" / "bin").mkdir(parents=True)
    prefixed = tree / "etc" / "localtime"
    prefixed.symlink_to(f"{tree}/usr/share/zoneinfo/Etc/UTC")
    (tree / "root-link").symlink_to(str(tree))
    (tree / "usr" / "bin" / "sh").symlink_to("dash")  # relative: left alone
    (tree / "etc" / "host").symlink_to("/etc/hostname")  # the guest's own already
    assert fakechroot.fix_symlinks(tree) == 2
    assert os.readlink(prefixed) == "/usr/share/zoneinfo/Etc/UTC"
    assert os.readlink(tree / "root-link") == "/"
    assert os.readlink(tree / "usr" / "bin" / "sh") == "dash"
    assert os.readlink(tree / "etc" / "host") == "/etc/hostname"


def test_the_trees_libraries_come_from_its_ld_so_conf(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    conf_d = tree / "etc" / "ld.so.conf.d"
    conf_d.mkdir(parents=True)
    (tree / "etc" / "ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (conf_d / "x86_64-linux-gnu.conf").write_text(
        "# Multiarch support\n/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n"
    )
    (conf_d / "libc.conf").write_text("/usr/local/lib\n")
    for folder in ("lib/x86_64-linux-gnu", "usr/local/lib", "usr/lib"):
        (tree / folder).mkdir(parents=True)
    # Sorted includes, listed folders that exist, then the default ones.
    assert fakechroot.library_dirs(tree) == [
        f"{tree}/usr/local/lib",
        f"{tree}/lib/x86_64-linux-gnu",
        f"{tree}/lib",
        f"{tree}/usr/lib",
    ]
