#!/usr/bin/env bash
# The test command: unit, functional, style and sample-config checks.
# Extra arguments are tox environments (default: py3,functional,functional-nova,pep8,genconfig).
set -euo pipefail
TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$TOP/tools/bootstrap.sh" test
cd "$TOP"
envs=${1:-py3,functional,functional-nova,pep8,genconfig}
"$VENV/bin/tox" -e "$envs"
# The sample config is generated, and must match what is committed.
git -C "$TOP" diff --exit-code -- etc/vgpu-driver/vgpu-driver.conf.sample
