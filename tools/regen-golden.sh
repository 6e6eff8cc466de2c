#!/usr/bin/env bash
# Rewrite every golden file under tests/golden/ from what the code prints
# now: runs each test module that calls assert_golden with
# VGPU_REGENERATE_GOLDEN=1, in its lane.  Review `git diff tests/golden`
# before committing: a change there is a change in what users see.
# TOX=/path/to/tox uses that tox instead of the one tools/bootstrap.sh makes.
set -euo pipefail
TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -z "${TOX:-}" ]; then
    source "$TOP/tools/bootstrap.sh" test
    TOX=$VENV/bin/tox
fi
cd "$TOP"
export VGPU_REGENERATE_GOLDEN=1

# The pytest lanes and their test directories.
for lane in py3:tests/unit functional:tests/functional; do
    modules=$(grep -lw assert_golden "${lane#*:}"/*.py || true)
    if [ -n "$modules" ]; then
        # shellcheck disable=SC2086 # one module per word
        "$TOX" exec -e "${lane%%:*}" -x testenv.pass_env+=VGPU_REGENERATE_GOLDEN \
            -- pytest -q -p no:cacheprovider $modules
    fi
done
# nova's lane (testtools): the modules by dotted name.
modules=$(grep -lw assert_golden tests/functional_nova/*.py | sed 's,/,.,g; s,\.py$,,' || true)
if [ -n "$modules" ]; then
    # shellcheck disable=SC2086 # one module per word
    "$TOX" exec -e functional-nova -x testenv.pass_env+=VGPU_REGENERATE_GOLDEN \
        -- env OS_NOVA_DISABLE_EVENTLET_PATCHING=1 python -m testtools.run $modules
fi
git status --short -- tests/golden
