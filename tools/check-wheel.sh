#!/usr/bin/env bash
# The wheel as a user gets it: build it (pip wheel --no-deps), fail on any
# warning of the build, install it with the demo's extras into a clean
# virtual environment, and run the demo from there, outside the checkout, so
# a file the code loads at run time and the wheel forgot fails here.
set -euo pipefail
TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

echo "==> building the wheel"
# From a copy of the files git would commit (tracked and new, not ignored):
# pip builds in the source tree, where a stale build/ would hide a file the
# package no longer ships.
mkdir "$WORK/src"
git -C "$TOP" ls-files -z -co --exclude-standard \
    | tar -C "$TOP" --null --ignore-failed-read -T - -cf - 2>/dev/null \
    | tar -C "$WORK/src" -xf -
# Byte-compiling on: distutils says "warning: ... disabled" otherwise.
env -u PYTHONDONTWRITEBYTECODE "$PYTHON" -m pip wheel -v --no-deps \
    --wheel-dir "$WORK/dist" "$WORK/src" >"$WORK/build.log" 2>&1 \
    || { cat "$WORK/build.log"; exit 1; }
# The build backend's warnings (SetuptoolsDeprecationWarning and kin, and
# distutils' "warning:" lines); pip's own notices about its indexes are not.
if grep -E "[A-Za-z]+Warning\b|^ *warning:" "$WORK/build.log"; then
    echo "error: the wheel's build warns (above)" >&2
    exit 1
fi
wheel=$(ls "$WORK"/dist/vgpu_driver-*.whl)
echo "    $(basename "$wheel")"
# (grep reads the whole listing: with pipefail, -q would fail the pipe.)
if ! "$PYTHON" -m zipfile -l "$wheel" | grep "^vgpu_driver/py.typed " >/dev/null; then
    echo "error: the wheel lacks vgpu_driver/py.typed (PEP 561)" >&2
    exit 1
fi
echo "    with vgpu_driver/py.typed"

echo "==> installing it with libvirt,placement,embedded-placement into a clean venv"
"$PYTHON" -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q "${wheel}[libvirt,placement,embedded-placement]"

cd "$WORK"
echo "==> vgpu-manage fake-host profiles: every profile of the checkout"
shipped=$("$WORK/venv/bin/vgpu-manage" fake-host profiles -f value -c name | sort)
wanted=$(cd "$TOP/vgpu_driver/fake/profiles" && ls -- *.json | sed 's/\.json$//' | sort)
echo "$shipped" | sed 's/^/    /'
if [ "$shipped" != "$wanted" ]; then
    echo "error: the wheel's profiles ($shipped) are not the checkout's ($wanted)" >&2
    exit 1
fi
echo "==> the operator's files under share/vgpu-driver/"
share="$WORK/venv/share/vgpu-driver"
for f in etc/vgpu-driver/sudoers.d/vgpu-driver \
         etc/systemd/vgpu-driver-sriov.service etc/systemd/nova-compute.service.d/vgpu-driver.conf \
         etc/systemd/vgpu-driver-metrics.service \
         etc/prometheus/vgpu-driver-alerts.yml etc/prometheus/vgpu-driver-rules.yml \
         etc/grafana/vgpu-driver-dashboard.json; do
    case $f in
        etc/systemd/*) installed="$share/systemd/${f#etc/systemd/}" ;;
        etc/prometheus/*) installed="$share/prometheus/${f#etc/prometheus/}" ;;
        etc/grafana/*) installed="$share/grafana/${f#etc/grafana/}" ;;
        *) installed="$share/etc/${f#etc/vgpu-driver/}" ;;
    esac
    if ! cmp -s "$TOP/$f" "$installed"; then
        echo "error: the wheel does not install $f as $installed" >&2
        exit 1
    fi
    echo "    ${installed#"$WORK"/venv/}"
done
echo "==> vgpu-manage install-units --dry-run: its templates and the scripts it names"
mkdir -p "$WORK/root/etc"
# install-units takes --user (nova) from the passwd of the tree it writes.
echo "nova:x:64060:64060::/var/lib/nova:/usr/sbin/nologin" >"$WORK/root/etc/passwd"
# and a configuration file of root's alone (it refuses anything else).
touch "$WORK/nova.conf"
"$WORK/venv/bin/vgpu-manage" --config-file "$WORK/nova.conf" install-units --root "$WORK/root" \
    --dry-run -f value -c path -c result | sed "s|$WORK/root|    <root>|"
echo "==> vgpu-manage --config-file /dev/null demo"
"$WORK/venv/bin/vgpu-manage" --config-file /dev/null demo
