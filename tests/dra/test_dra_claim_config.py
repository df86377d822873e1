"""Our DRA driver's opaque claim and class config (rdma_cni/dra/claims.py ``driver_config``): user
input decoded strictly, class configs before claim configs, other drivers' configs left alone, and
every unknown field refused by name, so no claim widens what the node decided.
"""

from __future__ import annotations

from typing import Any

import pytest

from rdma_cni.dra.claims import CONFIG_API_VERSION, CONFIG_KIND, ClaimShapeError, driver_config

pytestmark = pytest.mark.tenant

DRIVER = "rdma.tke.cloud.tencent.com"
OURS = {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND}


def claim(*config: dict[str, Any]) -> dict[str, Any]:
    return {"status": {"allocation": {"devices": {"results": [], "config": list(config)}}}}


def entry(source: str, parameters: Any, driver: str = DRIVER, **extra: Any) -> dict[str, Any]:
    return {"source": source, "opaque": {"driver": driver, "parameters": parameters}, **extra}


def test_class_configs_come_before_claim_configs_and_other_drivers_are_left_alone() -> None:
    got = driver_config(claim(entry("FromClaim", OURS, requests=["nic"]), entry("FromClass", OURS),
                              entry("FromClaim", {"anything": 1}, driver="gpu.example.com")), DRIVER)
    assert [(c.source, c.requests) for c in got] == [("FromClass", ()), ("FromClaim", ("nic",))]


def test_a_claim_without_config_has_none() -> None:
    assert driver_config({"status": {"allocation": {"devices": {"results": []}}}}, DRIVER) == []


@pytest.mark.parametrize(
    ("config", "names"),
    [
        (entry("FromClaim", {**OURS, "devicePluginDir": "/tmp/x"}), ["devicePluginDir", "ResourceClaim"]),
        (entry("FromClass", {**OURS, "masters": ["eth0"], "env": {}}), ["env, masters", "DeviceClass"]),
        (entry("FromClaim", {"apiVersion": "v1", "kind": CONFIG_KIND}), ["apiVersion 'v1'"]),
        (entry("FromClaim", "text"), ["is not an object"]),
        (entry("FromUser", OURS), ["source is 'FromUser'"]),
        (entry("FromClaim", OURS, requests="nic"), ["requests is not a list"]),
        ("x", ["config[0] is not an object"]),
    ],
)
def test_a_config_the_driver_does_not_define_is_refused_naming_the_field(
    config: Any, names: list[str]
) -> None:
    with pytest.raises(ClaimShapeError) as err:
        driver_config(claim(config), DRIVER)
    for name in names:
        assert name in str(err.value)


@pytest.mark.parametrize(
    "obj",
    [
        {"status": [1]},  # found by the fuzzer (dra-claim): AttributeError before the fix
        {"status": {"allocation": [1]}},
        {"status": {"allocation": {"devices": "x"}}},
        {"status": {"allocation": {"devices": {"results": {}}}}},
        {"metadata": [1], "status": {"allocation": {"devices": {"results": []}}}},
    ],
)
def test_a_claim_of_the_wrong_shape_is_a_shape_error_never_a_crash(obj: dict[str, Any]) -> None:
    from rdma_cni.dra.claims import allocated, uid_of

    for read in (lambda: allocated(obj, DRIVER, "node-a"), lambda: driver_config(obj, DRIVER)):
        try:
            read()
        except ClaimShapeError:
            pass
    assert isinstance(uid_of(obj), str)
