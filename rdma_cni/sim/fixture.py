"""Turn a sysfs capture (``shared/fixtures/sysfs-rxe-6.1/<state>/sys``) into a live-looking tree.

The capture stores each ``class/infiniband/<dev>`` link as a small text file holding the link target
(``../../devices/virtual/infiniband/mlx5_bond_0``) and keeps the read-only modes of the source. The
product reads the kernel's real layout, so tests copy the capture and restore those links as symlinks.

Usage::

    root = materialise(".../sysfs-rxe-6.1/host/sys", tmp_path / "sys")
    port_for_netdev(root, "bond0")
"""

from __future__ import annotations

import os
import shutil

# Directories whose entries are symlinks on a live system (captured as files holding the target).
LINK_DIRS = ("class/infiniband", "class/infiniband_verbs")


def _is_link_text(path: str) -> str | None:
    if not os.path.isfile(path) or os.path.getsize(path) > 4096:
        return None
    with open(path) as f:
        target = f.read().strip()
    return target if target.startswith("../") else None


def materialise(src: str, dst: str) -> str:
    """Copy the capture ``src`` to ``dst`` (writable), restoring captured links; returns ``dst``."""
    shutil.copytree(src, dst, copy_function=shutil.copyfile, dirs_exist_ok=True)
    for top, dirs, _files in os.walk(dst):
        os.chmod(top, 0o755)
        for d in dirs:
            os.chmod(os.path.join(top, d), 0o755)
    for rel in LINK_DIRS:
        base = os.path.join(dst, rel)
        if not os.path.isdir(base):
            continue
        for name in os.listdir(base):
            path = os.path.join(base, name.removesuffix(".symlink"))
            target = _is_link_text(os.path.join(base, name))
            if target is None:
                continue
            os.unlink(os.path.join(base, name))
            os.symlink(target, path)
    return dst
