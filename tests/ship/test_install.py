"""scripts/install.sh on a host root: the layout and configs it lays down, idempotence, mode
switches, upgrades and uninstall, a reader racing an upgrade, the kubeconfig from the service
account, the DaemonSet's install commands and the doctor reading the installation.

The bundle it installs is scripts/build's (``tests/install_support.py``); the bundle itself and its
programs are in ``test_install_bundle.py``, the thin client and the installed rdma-agent in
``test_install_agent.py``, ``--rdma-mode`` in ``test_install_rdma_mode.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import install_support
from install_support import NAMES, bare_env, install, installed, run, run_daemonset_installs, tree

# scripts/build's bundle, built once per run (tests/install_support.py).
bundle = install_support.bundle


def test_install_layout_configs_and_node_paths(bundle: Path, tmp_path: Path) -> None:
    proc = install(bundle, tmp_path, "--mode", "vpc-cni", "--conf-dir", "/etc/cni/net.d")
    assert proc.returncode == 0, proc.stderr
    build_id = (bundle / "BUILD_ID").read_text().strip()
    bin_dir = tmp_path / "opt/cni/bin"
    assert os.readlink(bin_dir / "rdma-cni.d/current") == build_id
    for name in NAMES:
        assert os.readlink(bin_dir / name) == f"rdma-cni.d/current/{name}"
        assert os.access(bin_dir / name, os.X_OK)
    meta = json.loads((tmp_path / "etc/cni/net.d/00-rdma-multus.conflist").read_text())
    assert meta["plugins"][0]["defaultDelegates"] == "tke-route-eni"
    # Configs name node paths, not the installer's view of them (--host-root).
    assert meta["plugins"][0]["confDir"] == "/etc/cni/net.d/rdma-multus.d"
    delegate = json.loads((tmp_path / "etc/cni/net.d/rdma-multus.d/tke-rdma-macvlan.conf").read_text())
    assert delegate["type"] == "rdma-macvlan"


def test_install_rewrites_paths_for_custom_dirs(bundle: Path, tmp_path: Path) -> None:
    proc = install(
        bundle,
        tmp_path,
        "--mode",
        "global-router",
        "--conf-dir",
        "/etc/cni/custom.d",
        "--cni-bin-dir",
        "/usr/libexec/cni",
        "--kubelet-root-dir",
        "/data/kubelet",
    )
    assert proc.returncode == 0, proc.stderr
    plugin = json.loads((tmp_path / "etc/cni/custom.d/00-rdma-multus.conflist").read_text())["plugins"][0]
    assert plugin["defaultDelegates"] == "tke-bridge"
    assert plugin["confDir"] == "/etc/cni/custom.d/rdma-multus.d"
    assert plugin["kubeconfig"] == "/etc/cni/custom.d/rdma-multus.d/rdma-multus.kubeconfig"
    assert plugin["kubeletRootDir"] == "/data/kubelet"  # pod-resources/ follows kubelet's --root-dir,
    assert plugin["devicePluginDir"] == "/var/lib/kubelet/device-plugins"  # device-plugins/ never moves
    assert (tmp_path / "usr/libexec/cni/rdma-macvlan").is_symlink()


def test_install_is_idempotent(bundle: Path, tmp_path: Path) -> None:
    assert install(bundle, tmp_path, "--mode", "vpc-cni").returncode == 0
    before = tree(tmp_path)
    proc = install(bundle, tmp_path, "--mode", "vpc-cni")
    assert proc.returncode == 0
    assert tree(tmp_path) == before, "a second install changed files"
    assert "wrote" not in proc.stderr and "linked" not in proc.stderr


def test_switching_mode_replaces_the_meta_config(bundle: Path, tmp_path: Path) -> None:
    assert install(bundle, tmp_path, "--mode", "vpc-cni").returncode == 0
    assert install(bundle, tmp_path, "--mode", "global-router").returncode == 0
    confs = sorted(p.name for p in (tmp_path / "etc/cni/net.d").glob("*.conflist"))
    assert confs == ["00-rdma-multus.conflist"]
    meta = json.loads((tmp_path / "etc/cni/net.d/00-rdma-multus.conflist").read_text())
    assert meta["plugins"][0]["defaultDelegates"] == "tke-bridge"


def test_without_mode_the_default_network_is_untouched(bundle: Path, tmp_path: Path) -> None:
    proc = install(bundle, tmp_path)
    assert proc.returncode == 0
    assert not (tmp_path / "etc/cni/net.d/00-rdma-multus.conflist").exists()
    assert (tmp_path / "etc/cni/net.d/rdma-multus.d/tke-rdma-macvlan.conf").is_file()
    assert "default network is unchanged" in proc.stderr


def test_bad_arguments_change_nothing(bundle: Path, tmp_path: Path) -> None:
    for args in (["--mode", "calico"], ["--conf-dir", "relative/dir"], ["--cni-bin-dir", "/a b"], ["--x"]):
        proc = install(bundle, tmp_path, *args)
        assert proc.returncode != 0 and "install.sh:" in proc.stderr, args
    assert list(tmp_path.iterdir()) == []


def _fake_build(bundle: Path, dest: Path, build_id: str) -> Path:
    """The same bundle under another BUILD_ID: an upgrade as install.sh sees it."""
    shutil.copytree(bundle, dest, symlinks=True)
    (dest / "BUILD_ID").write_text(build_id + "\n")
    return dest


def test_upgrade_keeps_one_previous_version_and_uninstall_removes_everything(
    bundle: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    builds = [_fake_build(bundle, tmp_path / f"b{i}", f"0.1.0-test{i}") for i in range(3)]
    for b in builds:
        assert install(b, root, "--mode", "vpc-cni").returncode == 0
    lib = root / "opt/cni/bin/rdma-cni.d"
    assert sorted(p.name for p in lib.iterdir()) == ["0.1.0-test1", "0.1.0-test2", "current"]
    assert os.readlink(lib / "current") == "0.1.0-test2"
    # Someone else's plugin in the same bin dir is never touched.
    (root / "opt/cni/bin/macvlan").write_text("#!/bin/sh\n")
    proc = run([str(bundle / "install.sh"), "--host-root", str(root), "--uninstall"])
    assert proc.returncode == 0, proc.stderr
    left = sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())
    assert left == ["opt/cni/bin/macvlan"]


def test_uninstall_refuses_while_pods_hold_bonds(bundle: Path, tmp_path: Path) -> None:
    assert install(bundle, tmp_path, "--mode", "vpc-cni").returncode == 0
    state = tmp_path / "var/lib/cni/rdma-macvlan"
    state.mkdir(parents=True)
    (state / "attachment.json").write_text("{}")
    proc = run([str(bundle / "install.sh"), "--host-root", str(tmp_path), "--uninstall"])
    assert proc.returncode != 0 and "DEL needs rdma-macvlan" in proc.stderr
    assert (tmp_path / "opt/cni/bin/rdma-macvlan").is_symlink()
    proc = run([str(bundle / "install.sh"), "--host-root", str(tmp_path), "--uninstall", "--force"])
    assert proc.returncode == 0
    assert not (tmp_path / "opt/cni/bin/rdma-macvlan").exists()


def test_a_reader_never_sees_a_half_installed_bundle_or_config(bundle: Path, tmp_path: Path) -> None:
    """Upgrades and mode switches in a loop while a reader checks, each with one syscall, what a pod
    start would open: the plugin binary behind the link, the bundle behind `current`, the configs."""
    root = tmp_path / "root"
    builds = [_fake_build(bundle, tmp_path / f"b{i}", f"0.1.0-race{i}") for i in range(4)]
    assert install(builds[0], root, "--mode", "vpc-cni").returncode == 0
    bin_dir = root / "opt/cni/bin"
    meta = root / "etc/cni/net.d/00-rdma-multus.conflist"
    delegate = root / "etc/cni/net.d/rdma-multus.d/tke-rdma-macvlan.conf"
    problems: list[str] = []
    done = threading.Event()
    reads = 0

    def reader() -> None:
        nonlocal reads
        while not done.is_set():
            try:
                for name in NAMES:
                    st = os.stat(bin_dir / name)  # follows both links in one call
                    assert st.st_size > 0 and st.st_mode & 0o111
                build_id = (bin_dir / "rdma-cni.d/current/BUILD_ID").read_text()
                assert build_id.startswith("0.1.0-race"), build_id
                assert (bin_dir / "rdma-cni.d/current/_internal/base_library.zip").stat().st_size > 0
                json.loads(meta.read_text())
                json.loads(delegate.read_text())
                reads += 1
            except (OSError, AssertionError, ValueError) as exc:
                problems.append(repr(exc))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i, b in enumerate(builds[1:] + builds[:2]):
            mode = "global-router" if i % 2 else "vpc-cni"
            proc = install(b, root, "--mode", mode)
            assert proc.returncode == 0, proc.stderr
    finally:
        done.set()
        thread.join()
    assert problems == []
    assert reads > 10


def test_kubeconfig_from_the_service_account_is_what_rdma_multus_reads(bundle: Path, tmp_path: Path) -> None:
    from rdma_cni.kube.kubeconfig import load

    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("tok-123\n")
    (sa / "ca.crt").write_bytes(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    env = {
        "PATH": os.environ["PATH"],
        "RDMA_CNI_SERVICEACCOUNT_DIR": str(sa),
        "KUBERNETES_SERVICE_HOST": "fd00::1",
        "KUBERNETES_SERVICE_PORT": "6443",
    }
    root = tmp_path / "root"
    cmd = [
        str(bundle / "install.sh"),
        "--bundle",
        str(bundle),
        "--host-root",
        str(root),
        "--mode",
        "vpc-cni",
        "--kubeconfig-from-serviceaccount",
    ]
    proc = run(cmd, env=env)
    assert proc.returncode == 0, proc.stderr
    path = root / "etc/cni/net.d/rdma-multus.d/rdma-multus.kubeconfig"
    assert path.stat().st_mode & 0o777 == 0o600
    cfg = load(str(path))
    assert cfg.server == "https://[fd00::1]:6443"
    assert cfg.bearer_token() == "tok-123"
    assert cfg.ca_data is not None and cfg.ca_data.startswith(b"-----BEGIN CERTIFICATE-----")
    meta = json.loads((root / "etc/cni/net.d/00-rdma-multus.conflist").read_text())
    assert meta["plugins"][0]["kubeconfig"] == "/etc/cni/net.d/rdma-multus.d/rdma-multus.kubeconfig"
    # A rotated token is picked up by the next run (the DaemonSet re-runs install.sh every 10 minutes).
    (sa / "token").write_text("tok-456\n")
    assert run(cmd, env=env).returncode == 0
    assert load(str(path)).bearer_token() == "tok-456"
    missing = run(cmd, env={**env, "RDMA_CNI_SERVICEACCOUNT_DIR": str(tmp_path / "none")})
    assert missing.returncode != 0 and "service account" in missing.stderr


def test_the_daemonset_install_commands_lay_down_a_node_installation(bundle: Path, tmp_path: Path) -> None:
    host = run_daemonset_installs(bundle, tmp_path)
    meta = json.loads((host / "etc/cni/net.d/00-rdma-multus.conflist").read_text())["plugins"][0]
    # Node paths in the node's configs, not the container's /host view.
    assert meta["confDir"] == "/etc/cni/net.d/rdma-multus.d"
    assert meta["kubeletRootDir"] == "/var/lib/kubelet" and meta["defaultDelegates"] == "tke-route-eni"
    assert (host / "etc/cni/net.d/rdma-multus.d/rdma-multus.kubeconfig").is_file()
    for name in NAMES:
        assert os.readlink(host / "opt/cni/bin" / name) == f"rdma-cni.d/current/{name}"


def test_doctor_of_the_installed_bundle_reads_the_installation(bundle: Path, tmp_path: Path) -> None:
    """The frozen cni-tool's doctor on what install.sh laid down: binaries with their build, the
    configs, and the one thing install.sh cannot provide (the cluster network's own config)."""
    bin_dir = installed(bundle, tmp_path / "root")
    conf_dir = tmp_path / "root/etc/cni/net.d"
    (tmp_path / "sys").mkdir()
    args = [
        "doctor",
        "--json",
        "--cni-bin-dir",
        str(bin_dir),
        "--conf-dir",
        str(conf_dir),
        "--sysfs-root",
        str(tmp_path / "sys"),
        "--kubelet-root-dir",
        str(tmp_path / "kubelet"),
        "--data-dir",
        str(tmp_path / "state"),
        "--run-dir",
        str(tmp_path / "run"),
    ]
    proc = run([str(bin_dir / "cni-tool"), *args], env=bare_env(tmp_path))
    assert proc.returncode == 1, proc.stderr  # no RDMA here, and no tke-route-eni config
    found = {f["check"]: f for f in json.loads(proc.stdout)["findings"]}
    build_id = (bundle / "BUILD_ID").read_text().strip()
    for name in ("rdma-macvlan", "rdma-multus"):
        assert found[f"binary {name}"]["status"] == "OK"
        assert f"(build {build_id})" in found[f"binary {name}"]["detail"]
    assert found["runtime-config"]["status"] == "OK"
    assert found["config tke-rdma-macvlan"]["status"] == "OK"
    assert found["default-network tke-route-eni"]["status"] == "FAIL"
    assert "tke-route-eni" in found["default-network tke-route-eni"]["fix"]
    assert found["rdma-devices"]["status"] == "FAIL"
