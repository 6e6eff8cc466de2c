#!/usr/bin/env bash
# Sourced by the other tools: makes .venv with tox and bindep, and installs the
# Debian packages bindep.txt names for PROFILE (when running as root).
set -euo pipefail
TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VGPU_VENV:-$TOP/.venv}
PROFILE=${1:-test}
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3

if [ ! -x "$VENV/bin/pip" ]; then
    echo "==> creating $VENV with $($PYTHON --version)"
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q tox bindep

missing=$(cd "$TOP" && "$VENV/bin/bindep" -b "$PROFILE" || true)
if [ -n "$missing" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "==> installing Debian packages: $(echo $missing)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing
    else
        echo "==> missing Debian packages (install them as root): $(echo $missing)" >&2
    fi
fi
