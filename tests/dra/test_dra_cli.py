"""``rdma-dra-driver``'s start-up refusals (one sentence, exit 2, no traceback) and the in-cluster
API config it uses without --kubeconfig."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from netns import REPO

from rdma_cni.cni.errors import CniError
from rdma_cni.dra.kubeapi import in_cluster


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("NODE_NAME", "KUBERNETES_SERVICE_HOST")}
    return subprocess.run([sys.executable, "-m", "rdma_cni.cli.dra_driver", "--log-file", "", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=60,
                          env={**base, "PYTHONPATH": REPO, **(env or {})})


def test_no_node_name_is_refused_with_the_fix(tmp_path: Path) -> None:
    p = run("--cni-conf", str(tmp_path / "none.conf"))
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines()[-1] == (
        "rdma-dra-driver: --node-name is empty: set NODE_NAME from the downward API (spec.nodeName) "
        "or give --node-name")


def test_bad_flag_value_names_the_flag(tmp_path: Path) -> None:
    p = run("--sysfs-root", str(tmp_path / "absent"), env={"NODE_NAME": "n"})
    assert p.returncode == 2 and "--sysfs-root" in p.stderr and "Traceback" not in p.stderr


def test_outside_a_pod_without_kubeconfig_says_to_give_one(tmp_path: Path) -> None:
    p = run("--cni-conf", str(tmp_path / "none.conf"), "--sysfs-root", str(tmp_path), env={"NODE_NAME": "n"})
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1].endswith("give --kubeconfig")


def test_in_cluster_reads_the_service_account(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_bytes(b"PEM")
    (tmp_path / "token").write_text("t0k\n")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    cfg = in_cluster(env, str(tmp_path))
    assert cfg.server == "https://10.96.0.1:443" and cfg.ca_data == b"PEM" and cfg.bearer_token() == "t0k"
    v6 = in_cluster({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}, str(tmp_path))
    assert v6.server == "https://[fd00::1]:443"
    with pytest.raises(CniError, match="ServiceAccount CA"):
        in_cluster({"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "1"}, str(tmp_path / "x"))


def test_the_bundle_runs_it_by_name() -> None:
    code = ("import sys; sys.argv = ['rdma-cni', 'rdma-dra-driver', '--help']; "
            "from rdma_cni.cli.multicall import main; main()")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60,
                       env={**os.environ, "PYTHONPATH": REPO})
    assert p.returncode == 0 and p.stdout.startswith("usage: rdma-dra-driver")
