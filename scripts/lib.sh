# Sourced by scripts/setup, scripts/demo and scripts/test: the two things every entry script needs.
#
# as_root "$@": re-run the calling script as root. The tests and the demo create network namespaces,
# so they need root; a root shell on a fresh Debian has no sudo, a normal user has one.
# project_python: the interpreter the project is installed in. On Debian's own python3 pip may not
# install system-wide (PEP 668, "externally managed"), so scripts/setup makes .venv/ there and every
# script uses it; an interpreter that can install (pyenv, a venv already active) is used as it is.

as_root() {
    [ "$(id -u)" -eq 0 ] && return 0
    if command -v sudo >/dev/null 2>&1; then
        exec sudo --preserve-env=PYTHON,TMPDIR "$0" "$@"
    fi
    echo "$(basename "$0"): needs root (network namespaces) and sudo is not installed: run it as root" >&2
    exit 1
}

_repo_root() { cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd; }

project_python() {
    local venv
    venv="$(_repo_root)/.venv"
    if [ -z "${PYTHON:-}" ] && [ -x "$venv/bin/python" ]; then
        echo "$venv/bin/python"
    else
        echo "${PYTHON:-python3}"
    fi
}

# The interpreter can pip-install into its own environment: pip present and not externally managed.
can_install_into() {
    "$1" -m pip --version >/dev/null 2>&1 || return 1
    "$1" - <<'PY'
import os, sys, sysconfig
managed = os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
sys.exit(1 if managed and sys.prefix == sys.base_prefix else 0)
PY
}
