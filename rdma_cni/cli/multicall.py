"""The single entry point of the PyInstaller bundle: one frozen program, several command names.

``scripts/build`` freezes this module once (onedir: nothing to unpack per run, unlike onefile) and
links ``rdma-macvlan``, ``rdma-ipvlan``, ``rdma-multus`` and ``cni-tool`` to it. The runtime execs a
plugin by the name it looked up, so the basename of ``argv[0]`` says which command to run. Each
command is imported only when chosen (the seven function-local imports below): VERSION of one plugin
never pays for another's imports, ~50-140 ms each (``python -X importtime``: a plugin's entry point
~50 ms, cni-tool ~73 ms, rdma-agent ~85 ms, rdma-device-plugin ~140 ms).

    $ ln -s rdma-cni rdma-macvlan && CNI_COMMAND=VERSION ./rdma-macvlan
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

BUNDLE_NAME = "rdma-cni"


def _macvlan() -> None:
    from rdma_cni.cli.macvlan import main

    main()


def _ipvlan() -> None:
    from rdma_cni.cli.ipvlan import main

    main()


def _multus() -> None:
    from rdma_cni.cli.multus import main

    main()


def _tool() -> None:
    from rdma_cni.cli.tool import main

    main()


def _agent() -> None:
    from rdma_cni.cli.agent import main

    main()


def _device_plugin() -> None:
    from rdma_cni.cli.device_plugin import main

    main()


def _dra_driver() -> None:
    from rdma_cni.cli.dra_driver import main

    main()


COMMANDS: dict[str, Callable[[], None]] = {
    "rdma-macvlan": _macvlan,
    "rdma-ipvlan": _ipvlan,
    "rdma-multus": _multus,
    "cni-tool": _tool,
    "rdma-agent": _agent,
    "rdma-device-plugin": _device_plugin,
    "rdma-dra-driver": _dra_driver,
}


def command_name(argv0: str) -> str:
    """``/opt/cni/bin/rdma-macvlan`` -> ``rdma-macvlan``; tolerant of ``./x`` and a trailing ``.exe``."""
    return os.path.basename(argv0).removesuffix(".exe")


def main() -> None:
    name = command_name(sys.argv[0] if sys.argv else "")
    if name == BUNDLE_NAME and len(sys.argv) > 1 and sys.argv[1] in COMMANDS:
        # `rdma-cni cni-tool gids`: the bundle run by its own name, command as first argument.
        name = sys.argv.pop(1)
        sys.argv[0] = name
    entry = COMMANDS.get(name)
    if entry is None:
        sys.stderr.write(
            f"{BUNDLE_NAME}: started as {name!r}; run it as one of {', '.join(COMMANDS)} "
            f"(a link to this program by that name) or as '{BUNDLE_NAME} COMMAND ...'\n"
        )
        sys.exit(2)
    entry()  # each entry point exits with its own code; returning means success
    sys.exit(0)


if __name__ == "__main__":
    main()
