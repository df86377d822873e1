"""The chart's PrometheusRule (``metrics.prometheusRule.enabled``): its rules as the chart renders them,
checked and unit-tested with Prometheus's own promtool (Debian's prometheus package): each alert fires
on the series the agent exports when a node has the fault, after its ``for``, and not on a healthy node.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from cluster import chart

pytestmark = [pytest.mark.helm]

HEALTHY = [
    "rdma_cni_bond_address_lost{instance='n1', bond='bond0'}",
    "rdma_cni_state_unreadable_records{instance='n1'}",
    "rdma_cni_gid_index_unified{instance='n1'}",
    "rdma_cni_device_plugin_pool_healthy{instance='n1', resource='r'}",
    "rdma_cni_device_plugin_registered{instance='n1', resource='r'}",
]


def rules(tmp_path: Path) -> tuple[Path, dict[str, dict[str, str]]]:
    """The rendered rule file, and each alert's annotation templates."""
    text = chart.template("--set", "metrics.prometheusRule.enabled=true")
    docs = [d for d in yaml.safe_load_all(text) if d]
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    notes = {r["alert"]: r["annotations"] for g in rule["spec"]["groups"] for r in g["rules"]}
    return path, notes


def rendered(template: str, labels: dict[str, str], value: str) -> str:
    """Prometheus's template for the two forms the rules use: {{ $labels.x }} and {{ $value }}."""
    out = re.sub(r"{{ \$labels\.(\w+) }}", lambda m: labels[m.group(1)], template)
    return out.replace("{{ $value }}", value)


def series(name: str, values: str) -> dict[str, str]:
    return {"series": name, "values": values}


def alert(notes: dict[str, dict[str, str]], name: str, at: str, labels: dict[str, str] | None = None,
          value: str = "") -> dict[str, object]:
    expected = [{"exp_labels": labels,
                 "exp_annotations": {k: rendered(v, labels, value) for k, v in notes[name].items()}}
                ] if labels else []
    return {"eval_time": at, "alertname": name, "exp_alerts": expected}


def test_the_rule_is_only_rendered_when_asked() -> None:
    assert "kind: PrometheusRule" not in chart.template()


def test_every_alert_fires_on_its_fault_and_not_on_a_healthy_node(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian's prometheus) is not installed: run ./scripts/setup")
    path, notes = rules(tmp_path)
    check = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    healthy = [series(s, "0x20" if "lost" in s or "unreadable" in s else "1x20") for s in HEALTHY]
    faulty = [
        series("rdma_cni_bond_address_lost{instance='n2', bond='bond3'}", "1x20"),
        series("rdma_cni_state_unreadable_records{instance='n2'}", "2x20"),
        series("rdma_cni_gid_index_unified{instance='n2'}", "0x20"),
        series("rdma_cni_device_plugin_registered{instance='n2', resource='r'}", "0x20"),
        series("rdma_cni_device_plugin_pool_healthy{instance='n2', resource='r'}", "0x20"),
    ]
    n2 = {"instance": "n2"}
    r2 = {**n2, "resource": "r"}
    tests = {"rule_files": [str(path)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": healthy + faulty,
        "alert_rule_test": [
            alert(notes, "RdmaCniBondAddressLost", "4m"),  # not before its 5 minutes
            alert(notes, "RdmaCniBondAddressLost", "6m", {**n2, "bond": "bond3", "severity": "critical"}),
            alert(notes, "RdmaCniUnreadableRecords", "6m", {**n2, "severity": "critical"}, "2"),
            alert(notes, "RdmaCniGidIndexNotUnified", "6m"),
            alert(notes, "RdmaCniGidIndexNotUnified", "11m", {**n2, "severity": "warning"}),
            alert(notes, "RdmaCniDevicePluginNotRegistered", "6m", {**r2, "severity": "critical"}),
            alert(notes, "RdmaCniDevicePluginPoolUnhealthy", "6m", {**r2, "severity": "warning"}),
        ],
    }]}  # fmt: skip
    spec = tmp_path / "tests.yaml"
    spec.write_text(yaml.safe_dump(tests))
    proc = subprocess.run([promtool, "test", "rules", str(spec)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
