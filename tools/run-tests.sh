#!/usr/bin/env bash
# The test command: unit, functional, style and sample-config checks.
# An argument names tox environments (default: tox.ini's envlist).
set -euo pipefail
TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$TOP/tools/bootstrap.sh" test
cd "$TOP"
# Without an argument, tox runs its envlist.
"$VENV/bin/tox" ${1:+-e "$1"}
# The sample config is generated, and must match what is committed.
git -C "$TOP" diff --exit-code -- etc/vgpu-driver/vgpu-driver.conf.sample
