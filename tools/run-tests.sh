#!/usr/bin/env bash
# The test command: unit, functional, style and sample-config checks.
# An argument names tox environments (default: tox.ini's envlist).
set -euo pipefail
TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$TOP/tools/bootstrap.sh" test
cd "$TOP"
# Without an argument, tox runs its envlist, two environments at a time (the
# machines it runs on have two cores; much of each lane waits on services),
# printing each lane's output as it comes.
if [ -n "${1:-}" ]; then
    "$VENV/bin/tox" -e "$1"
else
    "$VENV/bin/tox" --parallel 2 --parallel-live
fi
# The sample config is generated, and must match what is committed.
git -C "$TOP" diff --exit-code -- etc/vgpu-driver/vgpu-driver.conf.sample
