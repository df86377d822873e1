"""``cni-tool``: run a CNI network on a netns like upstream ``cnitool``, plus RDMA diagnostics.

``add|check|del NETWORK NETNS`` and ``status|gc NETWORK [NETNS]`` behave like upstream cnitool: the
network is found by name in ``NETCONFPATH`` (default /etc/cni/net.d), plugins in ``CNI_PATH``;
``CNI_ARGS`` and ``CAP_ARGS`` (JSON, handed to plugins that declare the capability) are read from
the environment; the interface is ``--ifname``, else ``CNI_IFNAME``, else ``eth0``; the container ID
is ``cnitool-`` plus the first 10 bytes (20 hex digits) of the SHA-512 of the absolute netns path,
so both tools name the same attachment the same way and share the libcni result cache
(``/var/lib/cni/results``; ``--cache-dir`` or ``CNI_TOOL_CACHE_DIR`` to move it).

Subcommands other helpers provide are registered by name in :data:`LAZY_COMMANDS` and imported only
when used, and the verbs import the protocol machinery where they use it (``cni.chain`` ~50 ms,
``cni.cache`` ~31 ms, ``cni.conflist`` ~12 ms, ``cli.tool_gc`` ~5 ms with what they import, measured
with ``python -X importtime``), which keeps ``cni-tool version`` fast. Errors are one sentence on
stderr, exit code 1.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from rdma_cni import __version__
from rdma_cni.cni.errors import CniError
from rdma_cni.cni.version import SUPPORTED

if TYPE_CHECKING:
    from rdma_cni.cni.cache import CacheEntry
    from rdma_cni.cni.chain import Runtime, RuntimeConf
    from rdma_cni.cni.conflist import NetworkConfigList

T = TypeVar("T")
DEFAULT_NETCONFPATH = "/etc/cni/net.d"
DEFAULT_IFNAME = "eth0"

# Subcommands living in other modules: name -> "module:attribute". Add one line per command.
LAZY_COMMANDS: dict[str, str] = {
    "gids": "rdma_cni.cli.tool_gids:gids",
    "doctor": "rdma_cni.cli.tool_doctor:doctor",
    "state": "rdma_cni.cli.tool_state:state",
    "held-claims": "rdma_cni.cli.tool_held_claims:held_claims",
}


class ToolError(click.ClickException):
    """A failure the user can act on: printed as one line, exit code 1, never a traceback."""

    def show(self, file: Any = None) -> None:
        click.echo(f"cni-tool: {self.format_message()}", err=True)


class LazyGroup(click.Group):
    """A group whose extra subcommands are imported on first use (see :data:`LAZY_COMMANDS`)."""

    def __init__(self, *args: Any, lazy: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy:
            return _load_lazy(cmd_name, self.lazy[cmd_name])
        return super().get_command(ctx, cmd_name)


def _load_lazy(name: str, target: str) -> click.Command:
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
        command = getattr(module, attr)
    except (ImportError, AttributeError) as exc:
        return _unavailable(name, target, exc)
    if not isinstance(command, click.Command):
        return _unavailable(name, target, TypeError(f"{target} is not a click command"))
    return command


def _unavailable(name: str, target: str, exc: BaseException) -> click.Command:
    """A stand-in that explains, when run, why the real command could not be loaded."""
    missing = isinstance(exc, ModuleNotFoundError) and exc.name == target.partition(":")[0]
    reason = "not part of this installation" if missing else f"failed to load ({type(exc).__name__}: {exc})"

    def fail(**_: Any) -> None:
        raise ToolError(f"'{name}' is not available: {target} is {reason}")

    return click.Command(
        name,
        callback=fail,
        help=f"(not available: {reason})",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        params=[click.Argument(["args"], nargs=-1, required=False)],
        add_help_option=False,
    )


@click.group(cls=LazyGroup, lazy=LAZY_COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--cache-dir",
    envvar="CNI_TOOL_CACHE_DIR",
    default="/var/lib/cni",
    show_default=True,
    help="libcni cache dir (results are kept in its results/ subdir).",
)
@click.pass_context
def cli(ctx: click.Context, cache_dir: str) -> None:
    """Run CNI networks on a network namespace (like cnitool), and inspect RDMA state.

    \b
    Environment (as upstream cnitool):
      NETCONFPATH  dir of *.conflist / *.conf network configs (default /etc/cni/net.d)
      CNI_PATH     ':'-separated plugin dirs
      CNI_ARGS     K=V;K=V arguments passed to every plugin
      CAP_ARGS     JSON object of capability args, e.g. '{"mac":"02:00:00:00:00:01"}'
      CNI_IFNAME   interface name when --ifname is not given (default eth0)
    """
    ctx.obj = {"cache_dir": cache_dir}


_IFNAME_HELP = "interface name in the netns (default: $CNI_IFNAME, else eth0)"


@cli.command()
@click.argument("network")
@click.argument("netns")
@click.option("-i", "--ifname", default=None, help=_IFNAME_HELP)
@click.pass_context
def add(ctx: click.Context, network: str, netns: str, ifname: str | None) -> None:
    """Add NETWORK's interface to NETNS; print the result and cache it."""
    runtime, net, rt = _setup(ctx, network, netns, ifname)
    _guard(lambda: runtime.validate(net, rt), f"add {network}")
    from rdma_cni.cni.chain import ChainError  # lazy: see the module doc

    try:
        result = runtime.add(net, rt)
    except ChainError as err:
        hint = _del_hint(network, netns, rt) if err.ran else ""
        raise ToolError(f"add {network}: {err.msg} (CNI error code {err.code}){hint}") from err
    except (CniError, OSError) as exc:  # every plugin succeeded, writing the cache did not
        msg = exc.msg if isinstance(exc, CniError) else str(exc)
        hint = _del_hint(network, netns, rt)
        raise ToolError(
            f"add {network}: the network was added but its result could not be cached: {msg}{hint}"
        ) from exc
    click.echo(json.dumps(result, indent=4))


@cli.command()
@click.argument("network")
@click.argument("netns")
@click.option("-i", "--ifname", default=None, help=_IFNAME_HELP)
@click.pass_context
def check(ctx: click.Context, network: str, netns: str, ifname: str | None) -> None:
    """Check NETWORK's interface in NETNS against the cached ADD result."""
    runtime, net, rt = _setup(ctx, network, netns, ifname)
    if not net.disable_check and _guard(lambda: runtime.cached_result(net, rt), f"check {network}") is None:
        click.echo(
            f"cni-tool: warning: no cached ADD result for {network} in {rt.netns}: plugins get no prevResult",
            err=True,
        )
    if not _guard(lambda: runtime.check(net, rt), f"check {network}"):
        click.echo(f"cni-tool: {network} has disableCheck set: nothing checked", err=True)


@cli.command(name="del")
@click.argument("network")
@click.argument("netns")
@click.option("-i", "--ifname", default=None, help=_IFNAME_HELP)
@click.pass_context
def delete(ctx: click.Context, network: str, netns: str, ifname: str | None) -> None:
    """Delete NETWORK's interface from NETNS (plugins in reverse order) and its cache entry."""
    runtime, net, rt = _setup(ctx, network, netns, ifname, allow_cached_config=True)
    _guard(lambda: runtime.delete(net, rt), f"del {network}")


@cli.command()
@click.argument("network")
@click.argument("netns", required=False)
@click.pass_context
def status(ctx: click.Context, network: str, netns: str | None) -> None:
    """Ask every plugin of NETWORK whether it could ADD now (CNI 1.1 STATUS).

    NETNS is accepted for compatibility with upstream cnitool, which ignores it too.
    """
    runtime, net = _runtime(ctx), _load(network)
    if _guard(lambda: runtime.status(net), f"status {network}"):
        click.echo(f"{network}: ready")
    else:
        click.echo(f"{network}: cniVersion {net.cni_version} has no STATUS (needs 1.1.0); not asked")


@cli.command()
@click.argument("network")
@click.argument("netns", required=False)
@click.option(
    "--all",
    "all_stale",
    is_flag=True,
    help="treat every cached attachment of NETWORK as stale (upstream cnitool's behaviour)",
)
@click.pass_context
def gc(ctx: click.Context, network: str, netns: str | None, all_stale: bool) -> None:
    """Delete NETWORK's cached attachments whose netns is gone, then send GC to its plugins.

    \b
    An attachment is stale when its netns is no longer a network namespace. Caches written by
    libcni < 1.2 (Debian's cnitool, containerd 1.6) record no netns; then:
      - the netns its plugins reported (result interfaces[].sandbox) decides;
      - else a cnitool container ID (cnitool-<hash of the netns path>) is stale when no
        existing netns path (bind mount or /proc/<pid>/ns/net) hashes to it;
      - else liveness is unknown: the attachment is KEPT and counted on stderr, since a
        guess could tear down a live pod. Remove such entries with `cni-tool del` or --all.

    NETNS is accepted for compatibility with upstream cnitool, which ignores it too.
    """
    from rdma_cni.cli.tool_gc import judge, netns_paths  # lazy: see the module doc

    runtime, net = _runtime(ctx), _load(network)
    ids: list[frozenset[str]] = []

    def live_ids() -> frozenset[str]:
        if not ids:
            ids.append(frozenset(container_id_for(p) for p in netns_paths()))
        return ids[0]

    why: dict[tuple[str, str], str] = {}
    unknown: list[CacheEntry] = []

    def valid(entry: CacheEntry) -> bool:
        if all_stale:
            why[entry.container_id, entry.ifname] = "--all"
            return False
        verdict = judge(entry, _is_netns, live_ids)
        why[entry.container_id, entry.ifname] = verdict.why
        if verdict.live is None:
            unknown.append(entry)
            return True
        return verdict.live

    report = _guard(lambda: runtime.gc(net, valid), f"gc {network}")
    for entry in report.deleted:
        reason = why[entry.container_id, entry.ifname]
        click.echo(f"deleted stale attachment {entry.container_id} {entry.ifname} ({reason})")
    for entry in unknown:
        reason = why[entry.container_id, entry.ifname]
        click.echo(f"kept attachment {entry.container_id} {entry.ifname}: liveness unknown ({reason})")
    if unknown:
        click.echo(
            f"cni-tool: kept {len(unknown)} attachment(s) of {network} whose cache entry records no "
            "netns (written by libcni < 1.2) and that no sandbox or cnitool ID ties to one; if their "
            f"pods are gone, remove them with `cni-tool del {network} NETNS --ifname IFNAME` "
            f"or `cni-tool gc {network} --all`",
            err=True,
        )
    for entry, err in report.failed:
        click.echo(f"cni-tool: could not delete {entry.container_id} {entry.ifname}: {err.msg}", err=True)
    if report.failed:
        sys.exit(1)


@cli.command()
def version() -> None:
    """Print the rdma-cni version and the CNI spec versions it speaks."""
    click.echo(f"cni-tool (rdma-cni) {__version__}; CNI spec versions {', '.join(SUPPORTED)}")


# ---- helpers -----------------------------------------------------------------------------------


def container_id_for(netns: str) -> str:
    """cnitool's container ID: 'cnitool-' + hex of the first 10 bytes of SHA-512(netns path)."""
    import hashlib  # lazy: it loads OpenSSL, ~5 ms (python -X importtime) that gids, state, doctor never use

    return "cnitool-" + hashlib.sha512(netns.encode()).hexdigest()[:20]


def absolute_netns(netns: str) -> str:
    """Go's filepath.Abs: absolute and cleaned (no '.', '..', '//' or trailing '/')."""
    return re.sub(r"^/+", "/", os.path.abspath(netns))


def parse_cni_args(raw: str) -> list[tuple[str, str]]:
    """cnitool's CNI_ARGS rule: 'K=V;K=V', every pair with one '=', non-empty key and value."""
    if not raw:
        return []
    pairs = []
    for pair in raw.split(";"):
        parts = pair.split("=")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise ToolError(f"invalid CNI_ARGS pair {pair!r}: use KEY=VALUE pairs separated by ';'")
        pairs.append((parts[0], parts[1]))
    return pairs


def parse_cap_args(raw: str) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ToolError(
            f'CAP_ARGS is not valid JSON ({exc}): give an object like \'{{"mac":"..."}}\''
        ) from exc
    if not isinstance(value, dict):
        raise ToolError('CAP_ARGS must be a JSON object like \'{"mac":"02:00:00:00:00:01"}\'')
    return value


def _runtime(ctx: click.Context) -> Runtime:
    from rdma_cni.cni.cache import ResultCache  # lazy: see the module doc
    from rdma_cni.cni.chain import Runtime

    dirs = [d for d in os.environ.get("CNI_PATH", "").split(":") if d]
    return Runtime(dirs, ResultCache(ctx.obj["cache_dir"]))


def _load(network: str) -> NetworkConfigList:
    from rdma_cni.cni import conflist  # lazy: see the module doc

    directory = os.environ.get("NETCONFPATH") or DEFAULT_NETCONFPATH
    if not os.path.isdir(directory):
        raise ToolError(f"NETCONFPATH {directory} is not a directory: point NETCONFPATH at your CNI configs")
    return _guard(lambda: conflist.load(directory, network), f"load {network}")


def _setup(
    ctx: click.Context, network: str, netns: str, ifname: str | None, allow_cached_config: bool = False
) -> tuple[Runtime, NetworkConfigList, RuntimeConf]:
    from rdma_cni.cni.chain import RuntimeConf  # lazy: see the module doc

    runtime = _runtime(ctx)
    path = absolute_netns(netns)
    name = ifname or os.environ.get("CNI_IFNAME") or DEFAULT_IFNAME
    rt = RuntimeConf(
        container_id=container_id_for(path),
        netns=path,
        ifname=name,
        args=parse_cni_args(os.environ.get("CNI_ARGS", "")),
        capability_args=parse_cap_args(os.environ.get("CAP_ARGS", "")),
    )
    try:
        net = _load(network)
    except ToolError as err:
        # A teardown must not depend on today's config dir: DEL falls back to the list cached at ADD.
        cached = _cached_config(runtime, network, rt) if allow_cached_config else None
        if cached is None:
            raise
        click.echo(f"cni-tool: {err.format_message()}; using the config cached at ADD", err=True)
        net = cached
    return runtime, net, rt


def _cached_config(runtime: Runtime, network: str, rt: RuntimeConf) -> NetworkConfigList | None:
    """The config list stored in the cache at ADD, so a network removed from disk can still be deleted."""
    from rdma_cni.cni import conflist  # lazy: see the module doc

    try:
        entry = runtime.cache.read(network, rt.container_id, rt.ifname)
        if entry is None or not entry.config:
            return None
        return conflist.parse_conflist(entry.config, f"cached config of {network}")
    except CniError:
        return None


def _is_netns(path: str) -> bool:
    """True when ``path`` is a live network namespace (nsfs), not a leftover mount point file."""
    try:
        return os.stat(path).st_dev == os.stat("/proc/self/ns/net").st_dev
    except OSError:
        return False


def _del_hint(network: str, netns: str, rt: RuntimeConf) -> str:
    return f"; undo what was added with: cni-tool del {network} {netns} --ifname {rt.ifname}"


def _guard(action: Callable[[], T], what: str, hint: str = "") -> T:
    """Run ``action``; a CniError becomes one line 'what: msg (code N)' and exit code 1."""
    try:
        return action()
    except CniError as err:
        raise ToolError(f"{what}: {err.msg} (CNI error code {err.code}){hint}") from err
    except OSError as exc:
        raise ToolError(f"{what}: {exc}") from exc


def main() -> None:
    cli(prog_name="cni-tool")


if __name__ == "__main__":
    main()
