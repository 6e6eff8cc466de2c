#!/usr/bin/env bash
# The main job on embedded defaults: a shipped fake host (an A100 SR-IOV board
# and eight T4s), nova.conf snippets, and what vgpu-manage shows of them.
set -euo pipefail
TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$TOP/tools/bootstrap.sh" build
"$VENV/bin/pip" install -q -e "$TOP[libvirt]"
exec "$VENV/bin/vgpu-manage" --config-file /dev/null demo "$@"
