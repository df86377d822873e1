"""The few facts about a pod a network plugin needs, read from the Pod API's JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Pod:
    """A pod, reduced to what a network plugin reads of it."""

    namespace: str
    name: str
    uid: str
    annotations: dict[str, str] = field(default_factory=dict)
    # resource name -> count the pod asks for (the kubelet's rule: max(sum of containers, any init container))
    requests: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_api(cls, obj: dict[str, Any]) -> Pod:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        annotations = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
        return cls(
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            annotations=annotations,
            requests=_requests(spec),
        )


def _requests(spec: dict[str, Any]) -> dict[str, int]:
    """Extended resources are integers and limits == requests for them, so either map is read."""
    total: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for name, count in _container_counts(container).items():
            total[name] = total.get(name, 0) + count
    for container in spec.get("initContainers") or []:
        for name, count in _container_counts(container).items():
            total[name] = max(total.get(name, 0), count)
    return total


def _container_counts(container: dict[str, Any]) -> dict[str, int]:
    resources = container.get("resources") or {}
    merged = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
    out: dict[str, int] = {}
    for name, value in merged.items():
        try:
            out[str(name)] = int(str(value))
        except ValueError:
            continue  # cpu "500m", memory "1Gi": not countable devices
    return out
