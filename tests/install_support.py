"""The shipped artifact as the install tests use it: scripts/build's onedir bundle, built once per
test run (PyInstaller, ~10-60 s; shared by the test workers, tests/shared_builds.py), and
scripts/install.sh run into temporary host roots.

Every check runs the installed binaries with no Python reachable (``bare_env``: PATH holds only
``ip``), so a node without Python is what is tested. Used by ``test_install.py``,
``test_install_bundle.py``, ``test_install_agent.py`` and ``test_install_rdma_mode.py`` (the
``bundle`` fixture is taken by assignment: ``bundle = install_support.bundle``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from shared_builds import built_once

REPO = Path(__file__).resolve().parent.parent
NAMES = ("rdma-macvlan", "rdma-multus", "cni-tool")
PLUGINS = ("rdma-macvlan", "rdma-multus")
PREFIX = "h10-"


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    proc: subprocess.CompletedProcess[str] = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, check=False, **kw
    )
    return proc


@pytest.fixture(scope="session")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """dist/rdma-cni as scripts/build makes it, built into a temp dir (never the repo's dist/), once
    per run for all test workers (tests/shared_builds.py)."""

    def build(out: Path) -> None:
        proc = run([str(REPO / "scripts" / "build"), "--out", str(out)])
        assert proc.returncode == 0, proc.stderr[-3000:]

    return built_once(tmp_path_factory, "h6-dist", build) / "rdma-cni"


def no_python_path(base: Path) -> str:
    """A PATH with `ip` and nothing else: the plugins must not need an interpreter."""
    d = base / "path"
    d.mkdir(exist_ok=True)
    for tool in ("ip",):
        found = shutil.which(tool)
        if found and not (d / tool).exists():
            (d / tool).symlink_to(found)
    assert shutil.which("python3", path=str(d)) is None and shutil.which("python", path=str(d)) is None
    return str(d)


def bare_env(base: Path, **extra: str) -> dict[str, str]:
    """No Python, and no rdma-agent either: the thin client must find no socket, so the bundle itself
    answers (an agent on this machine's default socket would otherwise serve the call)."""
    return {"PATH": no_python_path(base), "RDMA_CNI_AGENT_SOCKET": str(base / "no-agent.sock"), **extra}


def install(bundle: Path, root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(bundle / "install.sh"), "--bundle", str(bundle), "--host-root", str(root), *args]
    return run(cmd)


def walk(root: Path, file_key: Callable[[Path], str]) -> dict[str, tuple[str, str]]:
    """Everything under root: path -> (kind, link target or ``file_key`` of a file)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p))
        elif p.is_file():
            out[rel] = ("file", file_key(p))
        else:
            out[rel] = ("dir", "")
    return out


def tree(root: Path) -> dict[str, tuple[str, str]]:
    """Everything install.sh put under root: path -> (kind, link target or mtime and size)."""
    return walk(root, lambda p: f"{p.stat().st_mtime_ns}:{p.stat().st_size}")


def installed(bundle: Path, root: Path) -> Path:
    assert install(bundle, root, "--mode", "vpc-cni").returncode == 0
    return root / "opt/cni/bin"


def need(module: str) -> None:
    if not (REPO / "rdma_cni" / "cli" / f"{module}.py").exists():
        pytest.skip(f"rdma_cni/cli/{module}.py has not landed yet")


def ask_version(bin_dir: Path, name: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run([str(bin_dir / name)], env=env, input='{"cniVersion":"1.0.0"}')


def daemonset_commands(rdma_mode: str | None = None) -> list[list[str]]:
    """The install commands of conf/k8s/rdma-cni.yaml: the init container's, and the refresh loop's body
    (RDMA_MODE set to ``rdma_mode`` when given, as a user switches it)."""
    yaml = pytest.importorskip("yaml")
    docs = list(yaml.safe_load_all((REPO / "conf/k8s/rdma-cni.yaml").read_text()))
    pod = next(d for d in docs if d and d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    init = pod["initContainers"][0]
    env = {e["name"]: e["value"] for e in init["env"]}
    refresh_env = {e["name"]: e["value"] for e in pod["containers"][-1]["env"]}
    assert env["RDMA_MODE"] == refresh_env["RDMA_MODE"] == "exclusive"  # the shipped default
    if rdma_mode is not None:
        env["RDMA_MODE"] = rdma_mode
    first = [init["command"][0]]
    first += [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in init["args"]]
    loop = next(c for c in pod["containers"] if c["name"] == "refresh")["args"][0]
    body = loop[loop.index("/opt/rdma-cni/install.sh") :].split("\ndone")[0]
    second = [w.strip('"') for w in body.replace("\\\n", " ").split()]
    refresh_env.update(RDMA_MODE=env["RDMA_MODE"])
    second = [refresh_env[w[1:]] if w.startswith("$") else w for w in second]
    return [first, second]


def run_daemonset_installs(bundle: Path, tmp_path: Path, rdma_mode: str | None = None) -> Path:
    """Both install commands of the DaemonSet, run into tmp_path/host; returns that host root."""
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("t\n")
    (sa / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    env = {
        "PATH": os.environ["PATH"],
        "RDMA_CNI_SERVICEACCOUNT_DIR": str(sa),
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
    }
    host = tmp_path / "host"
    for cmd in daemonset_commands(rdma_mode):
        assert cmd[0] == "/opt/rdma-cni/install.sh"
        argv = [str(bundle / "install.sh")] + [
            str(bundle) if a == "/opt/rdma-cni/bundle" else str(host) if a == "/host" else a for a in cmd[1:]
        ]
        proc = run(argv, env=env)
        assert proc.returncode == 0, (cmd, proc.stderr)
    return host
