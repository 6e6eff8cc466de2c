#!/usr/bin/env bash
# Sourced by the other tools: makes .venv with tox and bindep, and installs the
# Debian packages bindep.txt names for PROFILE (when running as root).
set -euo pipefail
TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VGPU_VENV:-$TOP/.venv}
PROFILE=${1:-test}
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3

apt_updated=
as_root_apt_install() {
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "==> installing Debian packages: $*"
        # Once per run: a fresh machine comes here for python3-venv, then for bindep's list.
        [ -n "$apt_updated" ] || { apt-get update -qq; apt_updated=1; }
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
    else
        echo "==> missing Debian packages (install them as root): $*" >&2
        return 1
    fi
}

if [ ! -x "$VENV/bin/pip" ]; then
    echo "==> creating $VENV with $($PYTHON --version)"
    rm -rf "$VENV"
    # Debian's own python3 needs python3-venv (ensurepip) for this.
    if ! "$PYTHON" -m venv "$VENV" 2>/dev/null; then
        rm -rf "$VENV"
        as_root_apt_install python3-venv python3-dev
        "$PYTHON" -m venv "$VENV"
    fi
fi
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q tox tox-uv bindep

missing=$(cd "$TOP" && "$VENV/bin/bindep" -b "$PROFILE" || true)
if [ -n "$missing" ]; then
    # shellcheck disable=SC2086 # one package per word
    as_root_apt_install $missing || true
fi
