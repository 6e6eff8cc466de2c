#!/usr/bin/env bash
# The main job on embedded defaults: a shipped fake host (an A100 SR-IOV board
# and eight T4s) and nova.conf, the real Placement run in-process on sqlite,
# and guests booted through the driver into libvirt's test driver; then what
# an operator checks.  The extras bring libvirt-python (the guests),
# openstacksdk (the Placement client) and openstack-placement (the service).
set -euo pipefail
TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$TOP/tools/bootstrap.sh" build
"$VENV/bin/pip" install -q -e "$TOP[libvirt,placement,embedded-placement]"
exec "$VENV/bin/vgpu-manage" --config-file /dev/null demo "$@"
