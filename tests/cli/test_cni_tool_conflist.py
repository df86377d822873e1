"""Loading network configs like libcni, and the per-plugin stdin of a chain."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rdma_cni.cni import conflist
from rdma_cni.cni.conflist import NetworkNotFound
from rdma_cni.cni.errors import INVALID_CONFIG, CniError


def _write(directory: Path, name: str, obj: Any) -> bytes:
    data = (json.dumps(obj) if not isinstance(obj, str) else obj).encode()
    (directory / name).write_bytes(data)
    return data


def test_conflist_preferred_over_conf_of_the_same_name(tmp_path: Path) -> None:
    _write(tmp_path, "00-single.conf", {"cniVersion": "1.0.0", "name": "net", "type": "from-conf"})
    raw = _write(
        tmp_path, "99-list.conflist", {"cniVersion": "1.0.0", "name": "net", "plugins": [{"type": "a"}]}
    )
    net = conflist.load(str(tmp_path), "net")
    assert [p["type"] for p in net.plugins] == ["a"]
    assert net.raw == raw and net.source.endswith("99-list.conflist")


def test_files_are_searched_in_name_order_first_match_wins(tmp_path: Path) -> None:
    _write(tmp_path, "20-b.conflist", {"cniVersion": "1.0.0", "name": "net", "plugins": [{"type": "second"}]})
    _write(tmp_path, "10-a.conflist", {"cniVersion": "1.0.0", "name": "net", "plugins": [{"type": "first"}]})
    assert conflist.load(str(tmp_path), "net").plugins[0]["type"] == "first"


@pytest.mark.parametrize("ext", [".conf", ".json"])
def test_single_conf_becomes_a_one_plugin_list(tmp_path: Path, ext: str) -> None:
    plugin = {"cniVersion": "0.4.0", "name": "single", "type": "macvlan", "master": "eth0", "z": "<&>"}
    _write(tmp_path, "10-x" + ext, plugin)
    net = conflist.load(str(tmp_path), "single")
    assert (net.name, net.cni_version, net.plugins) == ("single", "0.4.0", (plugin,))
    # libcni's json.Marshal of a map: sorted keys, compact, Go's HTML escapes
    assert net.raw == (
        b'{"cniVersion":"0.4.0","name":"single","plugins":[{"cniVersion":"0.4.0","master":"eth0",'
        b'"name":"single","type":"macvlan","z":"\\u003c\\u0026\\u003e"}]}'
    )


def test_other_extensions_and_directories_are_ignored(tmp_path: Path) -> None:
    _write(tmp_path, "10-x.conf.bak", {"cniVersion": "1.0.0", "name": "net", "type": "a"})
    (tmp_path / "20-dir.conflist").mkdir()
    with pytest.raises(NetworkNotFound) as err:
        conflist.load(str(tmp_path), "net")
    assert "no network configs" in err.value.msg and err.value.code == INVALID_CONFIG


def test_not_found_lists_what_exists(tmp_path: Path) -> None:
    _write(tmp_path, "10-a.conflist", {"cniVersion": "1.0.0", "name": "alpha", "plugins": [{"type": "a"}]})
    _write(tmp_path, "20-b.conf", {"cniVersion": "1.0.0", "name": "beta", "type": "b"})
    with pytest.raises(NetworkNotFound) as err:
        conflist.load(str(tmp_path), "gamma")
    assert err.value.msg == f"no network named 'gamma' in {tmp_path}: found alpha, beta"


def test_missing_dir_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(NetworkNotFound):
        conflist.load(str(tmp_path / "nope"), "net")


def test_cni_versions_picks_highest_supported() -> None:
    data = json.dumps(
        {
            "cniVersion": "0.4.0",
            "cniVersions": ["1.0.0", "9.0.0", "0.3.1"],
            "name": "n",
            "plugins": [{"type": "a"}],
        }
    ).encode()
    assert conflist.parse_conflist(data).cni_version == "1.0.0"
    data = json.dumps({"cniVersions": ["1.1.0"], "name": "n", "plugins": [{"type": "a"}]}).encode()
    assert conflist.parse_conflist(data).cni_version == "1.1.0"


def test_flags_accept_bool_or_string() -> None:
    base = {"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "a"}]}
    net = conflist.parse_conflist(json.dumps({**base, "disableCheck": "True", "disableGC": True}).encode())
    assert net.disable_check and net.disable_gc
    assert not conflist.parse_conflist(json.dumps(base).encode()).disable_check


def test_plugins_from_network_subdir(tmp_path: Path) -> None:
    _write(tmp_path, "10-n.conflist", {"cniVersion": "1.1.0", "name": "n"})
    (tmp_path / "n").mkdir()
    _write(tmp_path / "n", "20-b.conf", {"type": "b"})
    _write(tmp_path / "n", "10-a.conf", {"type": "a"})
    _write(tmp_path / "n", "30-c.json", {"type": "ignored"})
    assert [p["type"] for p in conflist.load(str(tmp_path), "n").plugins] == ["a", "b"]
    _write(
        tmp_path,
        "10-n.conflist",
        {"cniVersion": "1.1.0", "name": "n", "loadOnlyInlinedPlugins": True, "plugins": [{"type": "inline"}]},
    )
    assert [p["type"] for p in conflist.load(str(tmp_path), "n").plugins] == ["inline"]


@pytest.mark.parametrize(
    "obj, field",
    [
        ("{", "not valid JSON"),
        ([], "JSON object"),
        ({"cniVersion": "1.0.0", "plugins": [{"type": "a"}]}, "'name'"),
        ({"cniVersion": "1.0.0", "name": 5, "plugins": [{"type": "a"}]}, "'name'"),
        ({"cniVersion": 1, "name": "n", "plugins": [{"type": "a"}]}, "'cniVersion'"),
        ({"cniVersion": "1.0.0", "name": "n", "plugins": []}, "'plugins'"),
        ({"cniVersion": "1.0.0", "name": "n", "plugins": {}}, "'plugins'"),
        ({"cniVersion": "1.0.0", "name": "n"}, "no plugins"),
        ({"cniVersion": "1.0.0", "name": "n", "plugins": [{}]}, "plugins[0]: field 'type'"),
        ({"cniVersion": "1.0.0", "name": "n", "plugins": ["a"]}, "plugins[0]"),
        (
            {"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "a", "capabilities": {"mac": "yes"}}]},
            "'capabilities'",
        ),
        ({"cniVersions": "1.0.0", "name": "n", "plugins": [{"type": "a"}]}, "'cniVersions'"),
        ({"cniVersions": ["one"], "name": "n", "plugins": [{"type": "a"}]}, "one"),
        (
            {"cniVersion": "1.0.0", "name": "n", "disableCheck": "maybe", "plugins": [{"type": "a"}]},
            "'disableCheck'",
        ),
    ],
)
def test_invalid_list_names_file_and_field(tmp_path: Path, obj: Any, field: str) -> None:
    _write(tmp_path, "10-bad.conflist", obj)
    _write(tmp_path, "20-good.conflist", {"cniVersion": "1.0.0", "name": "good", "plugins": [{"type": "a"}]})
    with pytest.raises(CniError) as err:
        conflist.load(str(tmp_path), "good")  # like libcni: a broken file stops the search
    assert err.value.code == INVALID_CONFIG
    assert "10-bad.conflist" in err.value.msg and field in err.value.msg


NET = conflist.parse_conflist(
    json.dumps({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "a"}]}).encode()
)


def test_plugin_stdin_forces_name_version_and_filters_capabilities() -> None:
    plugin = {
        "type": "a",
        "name": "other",
        "cniVersion": "0.1.0",
        "capabilities": {"mac": True, "ips": False, "bandwidth": True},
    }
    prev = {"cniVersion": "1.0.0", "dns": {}}
    out = conflist.plugin_stdin(NET, plugin, prev, {"mac": "m", "ips": ["x"], "portMappings": []})
    assert out["name"] == "n" and out["cniVersion"] == "1.0.0"
    assert out["prevResult"] == prev
    assert out["runtimeConfig"] == {"mac": "m"}
    assert plugin["name"] == "other", "the plugin's own config is not modified"
    bare = conflist.plugin_stdin(NET, {"type": "a", "runtimeConfig": {"x": 1}}, None, {"mac": "m"})
    assert bare["runtimeConfig"] == {"x": 1} and "prevResult" not in bare


def test_gc_and_status_stdin() -> None:
    gc = conflist.gc_stdin(NET, {"type": "a"}, [("c1", "eth0")])
    assert gc["cni.dev/valid-attachments"] == [{"containerID": "c1", "ifname": "eth0"}]
    assert "cni.dev/valid-attachments" not in conflist.gc_stdin(NET, {"type": "a"}, None)
    assert conflist.status_stdin(NET, {"type": "a"}) == {"type": "a", "name": "n", "cniVersion": "1.0.0"}


def test_convert_result_between_versions() -> None:
    res = {
        "cniVersion": "1.1.0",
        "interfaces": [{"name": "eth0", "mtu": 9000}],
        "ips": [{"address": "198.51.100.2/24", "interface": 0}],
        "dns": {},
    }
    assert conflist.convert_result(res, "0.4.0") == {
        "cniVersion": "0.4.0",
        "interfaces": [{"name": "eth0"}],
        "ips": [{"version": "4", "interface": 0, "address": "198.51.100.2/24"}],
        "dns": {},
    }
