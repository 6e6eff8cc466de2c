#!/usr/bin/env bash
# The test command: unit, functional, style and sample-config checks.
# No argument: tox.ini's envlist.  "all": that and the older nova releases'
# lanes (tox.ini's "all" label; what CI runs).  Any other argument names tox
# environments.
set -euo pipefail
TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$TOP/tools/bootstrap.sh" test
cd "$TOP"
# The tests' fake hosts and claims journals on tmpfs, where there is room;
# there, pytest removes each passed test's directory as the test ends, so
# that memory holds a test's trees, not a run's (tox.ini says more).
if [ -z "${VGPU_TEST_TMPDIR:-}" ] && [ -w /dev/shm ] &&
        [ "$(df -Pk /dev/shm | awk 'NR == 2 {print $4}')" -ge $((2 * 1024 * 1024)) ]; then
    export VGPU_TEST_TMPDIR=/dev/shm
    export VGPU_TEST_TMP_KEPT="${VGPU_TEST_TMP_KEPT:-failed}"
fi
# Without an argument, tox runs its envlist, two environments at a time (the
# machines it runs on have two cores), printing each lane's output as it comes.
# "all" runs the envlist first and prints its wall time ("default run: N s"),
# then the older nova releases' lanes (tox's "nova-releases" label), so that
# one CI run measures the default run too; it goes on to them when the
# envlist fails, and fails if either did.
if [ "${1:-}" = all ]; then
    started=$SECONDS
    status=0
    "$VENV/bin/tox" --parallel 2 --parallel-live || status=$?
    echo "default run: $((SECONDS - started)) s"
    "$VENV/bin/tox" --parallel 2 --parallel-live -m nova-releases || status=$?
    echo "all: $((SECONDS - started)) s"
    [ "$status" = 0 ] || exit "$status"
elif [ -n "${1:-}" ]; then
    "$VENV/bin/tox" -e "$1"
else
    "$VENV/bin/tox" --parallel 2 --parallel-live
fi
# The sample config is generated, and must match what is committed.
git -C "$TOP" diff --exit-code -- etc/vgpu-driver/vgpu-driver.conf.sample
