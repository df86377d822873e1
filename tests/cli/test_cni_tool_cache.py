"""The libcni result cache (``cniCacheV1``): format, round trips, path safety, atomicity."""

from __future__ import annotations

import base64
import json
import os
import stat

import pytest

from rdma_cni.cni import cache
from rdma_cni.cni.cache import CacheEntry, ResultCache
from rdma_cni.cni.errors import INVALID_CONFIG, INVALID_ENV, STATE_CORRUPT, UNKNOWN_CONTAINER, CniError

RESULT = {
    "cniVersion": "1.0.0",
    "interfaces": [{"name": "eth0", "mac": "02:00:00:00:00:01", "sandbox": "/var/run/netns/p"}],
    "ips": [{"interface": 0, "address": "198.51.100.10/24", "gateway": "198.51.100.1"}],
    "dns": {},
}
CONFIG = b'{"cniVersion":"1.0.0","name":"n1","plugins":[{"type":"macvlan"}]}'


def _entry(**kw: object) -> CacheEntry:
    base: dict[str, object] = dict(
        network="n1",
        container_id="c1",
        ifname="eth0",
        config=CONFIG,
        netns="/var/run/netns/p",
        cni_args=[("IgnoreUnknown", "1"), ("K8S_POD_NAME", "p<1>&")],
        capability_args={"mac": "02:00:00:00:00:42"},
        result=RESULT,
    )
    base.update(kw)
    return CacheEntry(**base)  # type: ignore[arg-type]


def test_file_layout_matches_libcni(tmp_path: str) -> None:
    rc = ResultCache(str(tmp_path))
    path = rc.write(_entry())
    assert path == os.path.join(str(tmp_path), "results", "n1-c1-eth0")
    raw = open(path, "rb").read()
    # Go struct field order, compact, HTML characters escaped like encoding/json.
    assert raw.startswith(b'{"kind":"cniCacheV1","containerId":"c1","config":"')
    assert b'"cniArgs":[["IgnoreUnknown","1"],["K8S_POD_NAME","p\\u003c1\\u003e\\u0026"]]' in raw
    keys = list(json.loads(raw))
    assert keys == [
        "kind",
        "containerId",
        "config",
        "ifName",
        "networkName",
        "netns",
        "cniArgs",
        "capabilityArgs",
        "result",
    ]
    data = json.loads(raw)
    assert base64.b64decode(data["config"]) == CONFIG
    assert data["result"] == RESULT
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700


def test_empty_optional_fields_are_omitted(tmp_path: str) -> None:
    raw = _entry(netns="", cni_args=[], capability_args={}, result=None).to_json()
    assert set(json.loads(raw)) == {"kind", "containerId", "config", "ifName", "networkName"}


def test_round_trip_and_byte_stability(tmp_path: str) -> None:
    rc = ResultCache(str(tmp_path))
    rc.write(_entry())
    got = rc.read("n1", "c1", "eth0")
    assert got == _entry()
    assert got is not None and got.to_json() == _entry().to_json()


def test_read_missing_is_none_and_delete_is_idempotent(tmp_path: str) -> None:
    rc = ResultCache(str(tmp_path))
    assert rc.read("n1", "c1", "eth0") is None
    rc.write(_entry())
    assert rc.delete("n1", "c1", "eth0") is True
    assert rc.delete("n1", "c1", "eth0") is False
    assert rc.read("n1", "c1", "eth0") is None


def test_legacy_bare_result_is_read(tmp_path: str) -> None:
    rc = ResultCache(str(tmp_path))
    os.makedirs(rc.results_dir)
    with open(os.path.join(rc.results_dir, "n1-c1-eth0"), "w") as f:
        json.dump(RESULT, f)
    got = rc.read("n1", "c1", "eth0")
    assert got is not None and got.result == RESULT and got.network == "n1" and got.config == b""


@pytest.mark.parametrize(
    "content, field",
    [
        (b"{not json", "not valid JSON"),
        (b"[]", "JSON object"),
        (b'{"kind":"other"}', "kind"),
        (b'{"kind":"cniCacheV1","containerId":5}', "containerId"),
        (b'{"kind":"cniCacheV1","config":"***"}', "config"),
        (b'{"kind":"cniCacheV1","cniArgs":[["a"]]}', "cniArgs"),
        (b'{"kind":"cniCacheV1","cniArgs":["ab"]}', "cniArgs"),
        (b'{"kind":"cniCacheV1","result":[]}', "result"),
        (b'{"kind":"cniCacheV1","capabilityArgs":"x"}', "capabilityArgs"),
    ],
)
def test_corrupt_file_is_state_corrupt_naming_field(tmp_path: str, content: bytes, field: str) -> None:
    rc = ResultCache(str(tmp_path))
    os.makedirs(rc.results_dir)
    path = os.path.join(rc.results_dir, "n1-c1-eth0")
    with open(path, "wb") as f:
        f.write(content)
    with pytest.raises(CniError) as err:
        rc.read("n1", "c1", "eth0")
    assert err.value.code == STATE_CORRUPT
    assert field in err.value.msg and path in err.value.msg


@pytest.mark.parametrize(
    "network, container_id, ifname, code",
    [
        ("../x", "c1", "eth0", INVALID_CONFIG),
        ("n1", "../x", "eth0", INVALID_ENV),
        ("n1", "a/b", "eth0", INVALID_ENV),
        ("n1", "", "eth0", UNKNOWN_CONTAINER),
        ("n1", "c1", "a/b", INVALID_ENV),
        ("n1", "c1", "..", INVALID_ENV),
        ("", "c1", "eth0", INVALID_CONFIG),
        (".hidden", "c1", "eth0", INVALID_CONFIG),
    ],
)
def test_unsafe_names_never_become_paths(
    tmp_path: str, network: str, container_id: str, ifname: str, code: int
) -> None:
    rc = ResultCache(str(tmp_path))
    with pytest.raises(CniError) as err:
        rc.write(_entry(network=network, container_id=container_id, ifname=ifname))
    assert err.value.code == code
    assert not os.path.exists(rc.results_dir)


def test_entries_lists_filters_and_skips_bad_files(tmp_path: str) -> None:
    rc = ResultCache(str(tmp_path))
    assert list(rc.entries()) == []
    rc.write(_entry())
    rc.write(_entry(container_id="c2"))
    rc.write(_entry(network="n2", container_id="c2", ifname="net1"))
    for name, content in (("junk", b"{"), (".tmp-123", b"{}"), ("legacy", json.dumps(RESULT).encode())):
        with open(os.path.join(rc.results_dir, name), "wb") as f:
            f.write(content)
    got = [(e.network, e.container_id, e.ifname) for e in rc.entries()]
    assert got == [("n1", "c1", "eth0"), ("n1", "c2", "eth0"), ("n2", "c2", "net1")]
    assert [e.network for e in rc.entries(container_id="c2")] == ["n1", "n2"]
    assert [e.container_id for e in rc.entries(network="n1")] == ["c1", "c2"]


def test_write_replaces_atomically_leaving_no_temp_files(tmp_path: str) -> None:
    rc = ResultCache(str(tmp_path))
    rc.write(_entry())
    rc.write(_entry(result={"cniVersion": "1.0.0", "dns": {}, "ips": []}))
    assert os.listdir(rc.results_dir) == ["n1-c1-eth0"]
    got = rc.read("n1", "c1", "eth0")
    assert got is not None and got.result == {"cniVersion": "1.0.0", "dns": {}, "ips": []}


def test_default_dir_is_libcni_default() -> None:
    assert cache.DEFAULT_CACHE_DIR == "/var/lib/cni"
    assert ResultCache().results_dir == "/var/lib/cni/results"
