"""install.sh's ``--rdma-mode``: the shared mode's delegate config and the device plugin's pools,
the exclusive mode's, the install without it byte for byte the one before the option (the node policy
aside), idempotence,
bad values, uninstall, switching modes while pods hold bonds or addresses, and the DaemonSet's
install commands with ``RDMA_MODE=shared``. The bundle: ``tests/install_support.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import install_support
import pytest
from install_support import REPO, install, run, run_daemonset_installs, tree, walk

# scripts/build's bundle, built once per run (tests/install_support.py).
bundle = install_support.bundle


DELEGATES = "etc/cni/net.d/rdma-multus.d"


DP_CONF = "etc/rdma-cni/device-plugin.yaml"
NODE_POLICY = "etc/rdma-cni/node-policy.json"


BEFORE_RDMA_MODE = "fccef42"  # the last commit whose install.sh had no --rdma-mode


def _contents(root: Path) -> dict[str, tuple[str, str]]:
    """Like tree, by content instead of mtime: what two installers laid down, comparable."""
    return walk(root, lambda p: f"{p.stat().st_mode:o}:{p.read_bytes().hex()}")


def _device_plugin_config(root: Path, tmp_path: Path) -> Any:
    """The installed device plugin config as the plugin loads it: its cniConf read in the host root."""
    yaml = pytest.importorskip("yaml")
    from rdma_cni.devices.config import load_config

    written = yaml.safe_load((root / DP_CONF).read_text())
    for d in ("sys", "dev"):
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
    flags = {
        "sysfs_root": str(tmp_path / "sys"),
        "dev_root": str(tmp_path / "dev"),
        "cni_conf": str(root / written["cniConf"].lstrip("/")),
    }
    return written, load_config(flags, str(root / DP_CONF))


def test_shared_install_writes_the_ipvlan_delegate_and_one_shared_pool_of_1000(
    bundle: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    proc = install(
        bundle, root, "--mode", "vpc-cni", "--rdma-mode", "shared", "--conf-dir", "/etc/cni/custom.d"
    )
    assert proc.returncode == 0, proc.stderr
    delegates = root / "etc/cni/custom.d/rdma-multus.d"
    shipped = (bundle / "conf/shared-mode/rdma-multus.d/tke-rdma-ipvlan.conf").read_bytes()
    assert (delegates / "tke-rdma-ipvlan.conf").read_bytes() == shipped
    assert json.loads(shipped)["name"] == "tke-rdma-ipvlan"
    assert (delegates / "tke-rdma-macvlan.conf").is_file()  # exclusive pods' DEL keeps working
    written, cfg = _device_plugin_config(root, tmp_path)
    # A node path (the --conf-dir given), not the installer's --host-root view.
    assert written["cniConf"] == "/etc/cni/custom.d/rdma-multus.d/tke-rdma-ipvlan.conf"
    assert [(s.resource_name, s.mode, s.count) for s in cfg.pool_specs()] == [
        ("tke.cloud.tencent.com/tke-shared-rdma", "shared", 1000)
    ]
    assert cfg.data_dir == "/var/lib/cni/rdma-ipvlan"  # the device plugin follows rdma-ipvlan's records
    assert oct((root / DP_CONF).stat().st_mode & 0o777) == "0o644"
    assert not list((root / "etc/rdma-cni").glob(".*tmp*"))  # written by rename: no temp file left


def test_shared_link_macvlan_is_written_into_the_ipvlan_delegate_and_a_bad_link_is_refused(
    bundle: Path, tmp_path: Path
) -> None:
    # Kernels without IPVLAN: the chart's shared.link value reaches the node through --shared-link.
    root = tmp_path / "root"
    proc = install(bundle, root, "--mode", "vpc-cni", "--rdma-mode", "shared", "--shared-link", "macvlan")
    assert proc.returncode == 0, proc.stderr
    written = json.loads((root / DELEGATES / "tke-rdma-ipvlan.conf").read_text())
    shipped = json.loads((bundle / "conf/shared-mode/rdma-multus.d/tke-rdma-ipvlan.conf").read_text())
    assert written == {**shipped, "link": "macvlan"}
    bad = install(bundle, tmp_path / "bad", "--mode", "vpc-cni", "--rdma-mode", "shared",
                  "--shared-link", "vlan")
    assert bad.returncode != 0 and "--shared-link must be ipvlan or macvlan" in bad.stderr
    assert not (tmp_path / "bad").exists()


def test_exclusive_rdma_mode_writes_only_the_device_plugins_exclusive_pool(
    bundle: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    assert install(bundle, root, "--mode", "vpc-cni", "--rdma-mode", "exclusive").returncode == 0
    assert sorted(p.name for p in (root / DELEGATES).iterdir()) == ["tke-rdma-macvlan.conf"]
    written, cfg = _device_plugin_config(root, tmp_path)
    assert written["cniConf"] == "/etc/cni/net.d/rdma-multus.d/tke-rdma-macvlan.conf"
    assert [(s.resource_name, s.mode) for s in cfg.pool_specs()] == [
        ("tke.cloud.tencent.com/tke-shared-rdma", "exclusive")
    ]
    assert cfg.data_dir == "/var/lib/cni/rdma-macvlan"


def test_without_rdma_mode_the_install_is_byte_for_byte_the_previous_one(
    bundle: Path, tmp_path: Path
) -> None:
    old = tmp_path / "install-before.sh"
    proc = run(["git", "-C", str(REPO), "show", f"{BEFORE_RDMA_MODE}:scripts/install.sh"])
    if proc.returncode != 0:
        pytest.skip(f"no git history with {BEFORE_RDMA_MODE} here: {proc.stderr.strip()}")
    old.write_text(proc.stdout)
    old.chmod(0o755)
    for args in (["--mode", "vpc-cni"], []):
        roots = (tmp_path / f"old{len(args)}", tmp_path / f"new{len(args)}")
        before = run([str(old), "--bundle", str(bundle), "--host-root", str(roots[0]), *args])
        now = install(bundle, roots[1], *args)
        assert before.returncode == now.returncode == 0, now.stderr
        # and the node policy, which every install writes since (tests/ship/test_install_node_policy.py)
        policy = roots[1] / NODE_POLICY
        assert json.loads(policy.read_text())["trust"] == "node"
        policy.unlink()
        (roots[1] / "etc/rdma-cni").rmdir()
        assert _contents(roots[0]) == _contents(roots[1]), args


def test_shared_install_is_idempotent(bundle: Path, tmp_path: Path) -> None:
    args = ("--mode", "vpc-cni", "--rdma-mode", "shared")
    assert install(bundle, tmp_path, *args).returncode == 0
    before = tree(tmp_path)
    proc = install(bundle, tmp_path, *args)
    assert proc.returncode == 0, proc.stderr
    assert tree(tmp_path) == before, "a second install changed files"
    assert "wrote" not in proc.stderr and "linked" not in proc.stderr and "switching" not in proc.stderr


def test_a_bad_rdma_mode_names_the_option_and_changes_nothing(bundle: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    for bad in ("Shared", "ipvlan", ""):
        proc = install(bundle, root, "--mode", "vpc-cni", "--rdma-mode", bad)
        assert proc.returncode != 0
        assert proc.stderr.strip() == f"install.sh: --rdma-mode must be exclusive or shared, got '{bad}'"
        assert not root.exists()
    # On an installed node too: nothing of the installation changes.
    assert install(bundle, root, "--rdma-mode", "shared").returncode == 0
    before = tree(root)
    assert install(bundle, root, "--rdma-mode", "exclusiv").returncode != 0
    assert tree(root) == before


def test_uninstall_removes_the_shared_files_and_refuses_while_pods_hold_addresses(
    bundle: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    assert install(bundle, root, "--mode", "vpc-cni", "--rdma-mode", "shared").returncode == 0
    (root / "opt/cni/bin/macvlan").write_text("#!/bin/sh\n")  # someone else's: never touched
    held = root / "var/lib/cni/rdma-ipvlan/attachments"
    held.mkdir(parents=True)
    (held / "c1@eth1.json").write_text("{}")
    uninstall = [str(bundle / "install.sh"), "--host-root", str(root), "--uninstall"]
    proc = run(uninstall)
    assert proc.returncode != 0 and "DEL needs rdma-ipvlan" in proc.stderr
    assert (root / DELEGATES / "tke-rdma-ipvlan.conf").is_file() and (root / DP_CONF).is_file()
    (held / "c1@eth1.json").unlink()
    proc = run(uninstall)
    assert proc.returncode == 0, proc.stderr
    left = sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())
    assert left == ["opt/cni/bin/macvlan"]
    assert not (root / "etc/rdma-cni").exists()


@pytest.mark.parametrize(
    ("start", "switch", "state"),
    [("shared", "exclusive", "rdma-ipvlan"), ("exclusive", "shared", "rdma-macvlan")],
)
def test_switching_the_rdma_mode_refuses_while_a_pod_holds_a_bond_or_an_address(
    bundle: Path, tmp_path: Path, start: str, switch: str, state: str
) -> None:
    assert install(bundle, tmp_path, "--mode", "vpc-cni", "--rdma-mode", start).returncode == 0
    held = tmp_path / "var/lib/cni" / state / "attachments"
    held.mkdir(parents=True)
    (held / "c1@eth1.json").write_text("{}")
    before = tree(tmp_path)
    proc = install(bundle, tmp_path, "--mode", "vpc-cni", "--rdma-mode", switch)
    assert proc.returncode != 0
    assert f"this node runs {start} mode and pods still hold bonds or addresses" in proc.stderr
    # The refusal names the node's directory that holds the record, once prefixed by --host-root
    # (the check once overwrote the caller's loop variable and named <root><root>/var/lib/cni/...).
    assert f"(state in {tmp_path}/var/lib/cni/{state})" in proc.stderr
    assert "--force" in proc.stderr
    assert tree(tmp_path) == before, "a refused switch changed files"
    # The same mode again is no switch: it goes through with the pod there.
    assert install(bundle, tmp_path, "--mode", "vpc-cni", "--rdma-mode", start).returncode == 0
    proc = install(bundle, tmp_path, "--mode", "vpc-cni", "--rdma-mode", switch, "--force")
    assert proc.returncode == 0, proc.stderr
    _, cfg = _device_plugin_config(tmp_path, tmp_path / "dp")
    assert [s.mode for s in cfg.pool_specs()] == [switch]
    assert (tmp_path / DELEGATES / "tke-rdma-ipvlan.conf").is_file() == (switch == "shared")
    assert (tmp_path / DELEGATES / "tke-rdma-macvlan.conf").is_file()


def test_the_daemonset_install_commands_with_rdma_mode_shared_lay_down_a_shared_node(
    bundle: Path, tmp_path: Path
) -> None:
    host = run_daemonset_installs(bundle, tmp_path, "shared")
    assert (host / DELEGATES / "tke-rdma-ipvlan.conf").is_file()
    written, cfg = _device_plugin_config(host, tmp_path)
    assert written["cniConf"] == "/etc/cni/net.d/rdma-multus.d/tke-rdma-ipvlan.conf"
    assert [(s.mode, s.count) for s in cfg.pool_specs()] == [("shared", 1000)]
