"""``vgpu-manage limits`` against the real Keystone, and the official CLI
as an independent reader of what it created."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests import keystone as ks
from tests.unit.test_cli import run  # noqa: F401 - the vgpu-manage fixture
from vgpu_driver.cmd import base

M60_TYPES = textwrap.dedent("""
    [devices]
    enabled_mdev_types = nvidia-35, nvidia-36
    [mdev_nvidia-35]
    device_addresses = 0000:84:00.0
    [mdev_nvidia-36]
    device_addresses = 0000:85:00.0
    mdev_class = CUSTOM_M60_8Q
    """)
WANTED = ["class:CUSTOM_M60_8Q", "class:VGPU"]


@pytest.fixture(scope="module")
def keystone():
    with ks.EmbeddedKeystone() as server:
        yield server


@pytest.fixture
def limits(keystone, make_host, run):  # noqa: F811
    """Run ``limits ...`` on an M60 host with ``[oslo_limit]`` as given."""
    keystone.delete_registered_limits()
    host = make_host("m60-multi")

    def limits(*argv, user=ks.ADMIN, endpoint_id=None):
        oslo_limit = keystone.oslo_limit_section(*user, endpoint_id=endpoint_id)
        code, out, err = run(
            "--sysfs-root", host.paths.root, "limits", *argv, conf=M60_TYPES + oslo_limit
        )
        return code, out, err

    yield limits
    keystone.delete_registered_limits()


def rows(out):
    return {r["resource_name"]: (r["default_limit"], r["status"]) for r in json.loads(out)}


def official_list(keystone):
    """``openstack registered limit list``, the official CLI, as the admin."""
    env = {**os.environ, **keystone.cli_environment()}
    openstack = os.path.join(os.path.dirname(sys.executable), "openstack")
    out = subprocess.run(
        [openstack, "registered", "limit", "list", "-f", "json"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {r["Resource Name"]: (r["Default Limit"], r["Region ID"]) for r in json.loads(out)}


def test_check_apply_dry_run_and_idempotence(keystone, limits):
    code, out, err = limits("check", "-f", "json")
    assert code == base.EXIT_PROBLEMS
    assert rows(out) == {name: (None, "missing") for name in WANTED}
    assert "class:CUSTOM_M60_8Q, class:VGPU" in err

    code, out, err = limits("apply", "--default-limit", "2", "--dry-run", "-f", "json")
    assert code == 0 and rows(out) == {name: (2, "would create") for name in WANTED}
    assert err.startswith("would create 2 registered limit(s)")
    assert official_list(keystone) == {}

    code, out, _ = limits("apply", "--default-limit", "2", "-f", "json")
    assert code == 0 and rows(out) == {name: (2, "created") for name in WANTED}
    assert official_list(keystone) == {name: (2, ks.REGION) for name in WANTED}

    code, out, err = limits("check", "-f", "json")
    assert code == 0 and rows(out) == {name: (2, "ok") for name in WANTED}
    assert err == ""

    code, out, err = limits("apply", "--default-limit", "5", "-f", "json")
    assert code == 0 and json.loads(out) == []
    assert err.startswith("created 0 registered limit(s)")
    assert official_list(keystone) == {name: (2, ks.REGION) for name in WANTED}


def test_existing_limit_is_kept_and_only_the_missing_one_created(keystone, limits):
    keystone.admin_connection().identity.create_registered_limit(
        service_id=keystone.nova_service_id(),
        region_id=ks.REGION,
        resource_name="class:VGPU",
        default_limit=7,
    )
    code, out, _ = limits("check", "-f", "json")
    assert code == base.EXIT_PROBLEMS
    assert rows(out) == {"class:VGPU": (7, "ok"), "class:CUSTOM_M60_8Q": (None, "missing")}
    code, out, _ = limits("apply", "--default-limit", "3", "-f", "json")
    assert rows(out) == {"class:CUSTOM_M60_8Q": (3, "created")}
    assert official_list(keystone) == {
        "class:VGPU": (7, ks.REGION),
        "class:CUSTOM_M60_8Q": (3, ks.REGION),
    }


def test_reader_can_check_but_apply_is_refused(keystone, limits):
    code, out, _ = limits("check", "-f", "json", user=ks.READER)
    assert code == base.EXIT_PROBLEMS and rows(out) == {n: (None, "missing") for n in WANTED}
    code, out, err = limits("apply", "--default-limit", "2", user=ks.READER)
    assert code == base.EXIT_ERROR and out == ""
    assert err.startswith(
        "error: Keystone refused to create registered limit "
        "class:CUSTOM_M60_8Q: the [oslo_limit] user lacks the role for "
        "it (creating limits needs a system admin; "
    )
    assert len(err.splitlines()) == 1
    assert official_list(keystone) == {}


def test_bad_credentials(limits):
    code, out, err = limits("check", user=(ks.ADMIN[0], "wrong"))
    assert code == base.EXIT_ERROR and out == ""
    assert err.startswith(
        "error: Keystone refused to authenticate: the [oslo_limit] credentials were rejected"
    )
    assert len(err.splitlines()) == 1 and len(err.splitlines()) == 1


def test_unknown_endpoint(limits):
    code, _, err = limits("check", endpoint_id="0" * 32)
    assert code == base.EXIT_ERROR
    assert err.startswith(f"error: Keystone refused to read endpoint {'0' * 32}")


def test_stopped_keystone(keystone, limits):
    keystone.stop()
    try:
        code, out, err = limits("check")
    finally:
        keystone.start()
    assert code == base.EXIT_ERROR and out == ""
    assert err.startswith(f"error: Keystone at {keystone.auth_url} cannot be reached")
    assert len(err.splitlines()) == 1


def test_missing_oslo_limit_section(make_host, run):  # noqa: F811
    host = make_host("m60-multi")
    code, _, err = run("--sysfs-root", host.paths.root, "limits", "check", conf=M60_TYPES)
    assert code == base.EXIT_ERROR
    assert err == (
        "error: Keystone: [oslo_limit] auth_type is not set; set [oslo_limit] "
        "as nova's unified limits use it.\n"
    )


def test_negative_default_limit_is_refused_before_keystone(tmp_path):
    conf = tmp_path / "nova.conf"
    conf.write_text(M60_TYPES)
    manage = os.path.join(os.path.dirname(sys.executable), "vgpu-manage")
    done = subprocess.run(
        [manage, "--config-file", str(conf), "limits", "apply", "--default-limit", "-1"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == base.EXIT_ERROR and done.stdout == ""
    assert done.stderr.splitlines()[-1].endswith("not a non-negative integer: '-1'")
