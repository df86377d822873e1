"""``install.sh --check``: the refresh container's readiness. It changes nothing, says the first thing
missing, and with ``--wait`` looks again every second, so a node that becomes whole while it waits is
ready then, not at the next probe period."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "scripts" / "install.sh"


def _bundle(tmp: Path) -> Path:
    bundle = tmp / "bundle"
    bundle.mkdir()
    for name in ("rdma-cni", "rdma-macvlan"):
        (bundle / name).write_text("#!/bin/sh\nexit 1\n")
        (bundle / name).chmod(0o755)
    (bundle / "BUILD_ID").write_text("0.0.0-check-test\n")
    shutil.copytree(REPO / "conf", bundle / "conf")
    return bundle


def _sh(*args: str) -> subprocess.CompletedProcess[str]:
    argv = ["sh", str(INSTALL), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): (p.read_text() if p.is_file() else "") for p in sorted(root.rglob("*"))}


def test_check_on_a_node_never_installed_says_so_and_changes_nothing(tmp_path: Path) -> None:
    host = tmp_path / "host"
    (host / "etc/cni/net.d").mkdir(parents=True)
    before = _tree(host)
    p = _sh("--check", "--host-root", str(host), "--mode", "vpc-cni", "--rdma-mode", "exclusive")
    assert p.returncode == 1 and "the installer has not run" in p.stderr, p.stderr
    assert _tree(host) == before


def test_check_passes_after_install_and_names_a_plugin_link_that_went(tmp_path: Path) -> None:
    host = tmp_path / "host"
    (host / "etc/cni/net.d").mkdir(parents=True)
    opts = ["--host-root", str(host), "--mode", "vpc-cni", "--rdma-mode", "shared"]
    assert _sh("--bundle", str(_bundle(tmp_path)), *opts).returncode == 0
    assert _sh("--check", *opts).returncode == 0
    (host / "opt/cni/bin/rdma-macvlan").unlink()
    p = _sh("--check", *opts)
    assert p.returncode == 1 and "opt/cni/bin/rdma-macvlan is not a link to the installed bundle" in p.stderr
    # shared mode's own delegate is part of what shared mode needs (the install puts the link back)
    assert _sh("--bundle", str(tmp_path / "bundle"), *opts).returncode == 0
    (host / "etc/cni/net.d/rdma-multus.d/tke-rdma-ipvlan.conf").unlink()
    p = _sh("--check", *opts)
    assert p.returncode == 1 and "tke-rdma-ipvlan.conf is missing or empty" in p.stderr, p.stderr


def test_check_waits_for_a_device_plugin_that_registers_meanwhile(tmp_path: Path) -> None:
    host = tmp_path / "host"
    (host / "etc/cni/net.d").mkdir(parents=True)
    opts = ["--host-root", str(host), "--mode", "vpc-cni", "--rdma-mode", "exclusive"]
    assert _sh("--bundle", str(_bundle(tmp_path)), *opts).returncode == 0
    status = host / "run/rdma-cni/device-plugin/status.json"
    status.parent.mkdir(parents=True)
    status.write_text('{"pools":[{"registered":false}],"registered":false}')
    check = [*opts, "--check", "--device-plugin-status", "/run/rdma-cni/device-plugin/status.json"]
    assert _sh(*check).returncode == 1

    def register() -> None:
        time.sleep(1.5)
        status.write_text('{"pools":[{"registered":true}],"registered":true}')

    t = threading.Thread(target=register)
    t.start()
    t0 = time.monotonic()
    p = _sh(*check, "--wait", "10")
    took = time.monotonic() - t0
    t.join()
    assert p.returncode == 0, p.stderr
    assert took < 9, f"ready only after {took:.1f} s: the wait did not look again"


def test_check_refuses_a_wait_that_is_not_whole_seconds(tmp_path: Path) -> None:
    p = _sh("--check", "--host-root", str(tmp_path), "--wait", "1.5")
    assert p.returncode == 1 and "--wait takes whole seconds, got '1.5'" in p.stderr
