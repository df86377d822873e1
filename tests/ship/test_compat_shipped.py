"""What the previous version shipped, read by this one (docs/compatibility-policy.md, "CNI configs"
and "Chart values"): every CNI config its bundle installed is a config this version's plugins
take for ADD and for DEL, as installed on a node (through the node policy's defaults), and a
values file written for its chart is accepted by this chart (``helm template``: the schema
refuses any key it does not know, so a key removed or renamed without a deprecation would fail
here).

The previous version is :data:`previous_version.PREVIOUS`, read from git history.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import previous_version
import pytest
from cluster import chart

from rdma_cni import node_policy
from rdma_cni.plugins.ipvlan import config as ipvlan_config
from rdma_cni.plugins.macvlan import config as macvlan_config
from rdma_cni.plugins.multus import config as multus_config


def previous_file(path: str) -> str:
    proc = subprocess.run(["git", "-C", previous_version.REPO, "show", f"{previous_version.PREVIOUS}:{path}"],
                          capture_output=True, text=True, check=False, timeout=60)
    if proc.returncode != 0:
        pytest.skip(f"no git history here: {proc.stderr.strip()}")
    return proc.stdout


def previous_cni_files() -> list[str]:
    proc = subprocess.run(["git", "-C", previous_version.REPO, "ls-tree", "-r", "--name-only",
                           previous_version.PREVIOUS, "conf/"], capture_output=True, text=True, check=False,
                          timeout=60)
    names = [n for n in proc.stdout.split() if n.endswith((".conf", ".conflist")) and "/k8s/" not in n]
    return names or ["(no git history)"]


PARSERS: dict[str, tuple[Callable[[dict[str, Any]], Any], Callable[[dict[str, Any]], Any]]] = {
    "rdma-macvlan": (macvlan_config.parse_config, macvlan_config.parse_del_config),
    "rdma-ipvlan": (ipvlan_config.parse_config, ipvlan_config.parse_del_config),
    "rdma-multus": (multus_config.parse_config, multus_config.parse_cleanup_config),
}


@pytest.mark.parametrize("path", previous_cni_files())
def test_every_config_the_previous_version_installed_is_read_by_this_one(path: str, tmp_path: Path) -> None:
    doc = json.loads(previous_file(path))
    policy = node_policy.load({node_policy.POLICY_ENV: str(tmp_path / "none.json")})  # the defaults
    plugins = doc["plugins"] if "plugins" in doc else [doc]
    for plugin in plugins:
        parse_add, parse_del = PARSERS[plugin["type"]]
        raw = {"cniVersion": doc["cniVersion"], "name": doc["name"], **plugin}
        parse_add(policy.narrow(raw, plugin["type"]))
        dropped = parse_del(policy.narrow(raw, plugin["type"], cleanup=True))[1]
        assert dropped == [], (path, dropped)


@pytest.mark.helm
@pytest.mark.parametrize("sets", [[], ["--set", "rdmaMode=shared"], ["--set", "frontEnd=dra"]])
def test_a_values_file_of_the_previous_chart_is_accepted_by_this_chart(
    sets: list[str], tmp_path: Path
) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(previous_file("charts/rdma-cni/values.yaml"))
    proc = chart.run("template", chart.RELEASE, str(chart.CHART), "--namespace", chart.NAMESPACE,
                     "-f", str(values), *sets)
    assert proc.returncode == 0, proc.stderr
    assert "kind: DaemonSet" in proc.stdout
