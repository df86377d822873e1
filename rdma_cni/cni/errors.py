"""The one error type of the project: an exception that carries its CNI error code.

Every layer raises :class:`CniError` (or lets an ``OSError`` escape); the dispatcher is the only
place that turns it into the error JSON the spec wants on stdout.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")

# Codes from the CNI spec (SPEC.md, "Error" section).
INCOMPATIBLE_VERSION = 1
UNSUPPORTED_FIELD = 2
UNKNOWN_CONTAINER = 3
INVALID_ENV = 4
IO_FAILURE = 5
DECODE_FAILURE = 6
INVALID_CONFIG = 7
INVALID_NETNS = 8  # libcni's ErrInvalidNetNS: CNI_NETNS is the plugin's own netns
TRY_AGAIN_LATER = 11
STATUS_UNAVAILABLE = 50
STATUS_NO_IPAM = 51

# Plugin-specific codes (>= 100), each with its cause, check and fix in docs/troubleshooting.md.
NETLINK_FAILURE = 100  # the kernel refused a link/address/route operation
RDMA_MODE_MISMATCH = 101  # kernel RDMA netns mode differs from rdma.netnsMode
GID_MISMATCH = 102  # pod GID index differs from the host's / configured one
GID_TIMEOUT = 103  # the kernel did not publish the pod's GID in time
NO_RDMA_DEVICE = 104  # rdma.required and a bond has no RDMA device
DELEGATE_FAILURE = 105  # a delegate plugin (IPAM, multus delegate) failed
KUBE_API_FAILURE = 106  # the Kubernetes API could not be reached or answered an error
CHECK_FAILED = 107  # CHECK found the live system differs from the recorded one
STATE_CORRUPT = 108  # durable state could not be used


class CniError(Exception):
    """A failure the runtime should see as a CNI error: ``code``, one-line ``msg``, ``details``."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg
        self.details = details

    def to_dict(self, cni_version: str) -> dict[str, object]:
        out: dict[str, object] = {"cniVersion": cni_version, "code": self.code, "msg": self.msg}
        if self.details:
            out["details"] = self.details
        return out

    def __repr__(self) -> str:
        return f"CniError({self.code}, {self.msg!r})"


class ConfigKeyError(CniError):
    """Error 7 about one config key (``key``, dotted for nested ones): DEL can leave that key out."""

    def __init__(self, key: str, msg: str) -> None:
        super().__init__(INVALID_CONFIG, msg)
        self.key = key


def invalid_key(key: str, problem: str, got: Any, fixes: Mapping[str, str], plugin: str) -> ConfigKeyError:
    """Error 7 for one config key that does not validate: the problem, what it got (an object is
    not echoed whole), and the fix for the key (or its top-level key) from the plugin's ``fixes``."""
    shown = repr(got) if not isinstance(got, dict) else "an object"
    fix = fixes.get(key) or fixes.get(key.split(".")[0]) or f"what the {plugin} config reference gives"
    return ConfigKeyError(key, f"config key '{key}' is invalid ({problem}, got {shown}): use {fix}")


def validate_dropping_bad_keys(
    raw: dict[str, Any], validate: Callable[[dict[str, Any]], T], essential: frozenset[str]
) -> tuple[T, list[str]]:
    """``validate(raw)`` with every key (or ``key.sub``) it refuses left out, one at a time, until it
    passes: DEL and GC must undo what ADD did whatever is wrong with the config now. A refused key in
    ``essential``, or one not in the config itself, is still the error. Returns the config and the
    problems dropped (for the log)."""
    conf = dict(raw)
    dropped: list[str] = []
    while True:
        try:
            return validate(conf), dropped
        except ConfigKeyError as exc:
            top, _, sub = exc.key.partition(".")
            if top in essential or top not in conf:
                raise
            inner = conf[top]
            if sub and isinstance(inner, dict) and sub in inner:
                conf[top] = {k: v for k, v in inner.items() if k != sub}
            else:
                del conf[top]
            dropped.append(exc.msg)
