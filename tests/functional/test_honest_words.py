"""What vgpu-manage says matches what it did and what it saw."""

import io
import json
import logging
import sys

from tests.functional import test_placement_sync as sync_tests
from tests.placement_faults import FaultInjector
from vgpu_driver import claims_journal
from vgpu_driver import placement_service
from vgpu_driver.cmd import manage

service = sync_tests.service
api = sync_tests.api
T4 = sync_tests.T4
ALL = "[devices]\nenabled_mdev_types = nvidia-231\n"
ONE = ALL + f"[mdev_nvidia-231]\ndevice_addresses = {T4[0]}\n"


def test_dry_run_says_would_and_an_unconfigured_gpu_is_not_gone(
    make_host, tmp_path, service, monkeypatch, api, caplog
):
    host = make_host("t4x8")
    args = (tmp_path, service, monkeypatch, host.paths.root)
    assert sync_tests.run_cli(*args, "sync", conf=ALL)[0] == 0
    caplog.set_level(logging.INFO, logger="vgpu_driver.placement")
    code, out, _ = sync_tests.run_cli(*args, "sync", "--dry-run", "-f", "json", conf=ONE)
    assert code == 0
    assert sum(r["method"] == "DELETE" for r in json.loads(out)) == 7
    assert len(sync_tests.placement_view(api, "cn1")) == 9  # nothing deleted
    assert "Deleted" not in caplog.text
    assert (
        f"Would delete provider cn1_pci_0000_19_00_0: its GPU {T4[1]} is no longer "
        "configured (not listed in any [mdev_<type>] device_addresses nor matched by "
        "device_ids) and nothing is allocated on it"
    ) in caplog.text


def test_a_gpu_whose_vfs_went_off_says_so(make_host, tmp_path, service, monkeypatch, caplog):
    host = make_host("a100-sriov")
    args = (tmp_path, service, monkeypatch, host.paths.root)
    conf = "[devices]\nenabled_mdev_types = nvidia-468\n"
    assert sync_tests.run_cli(*args, "sync", conf=conf)[0] == 0
    host.set_vfs("0000:41:00.0", 0)
    caplog.set_level(logging.INFO, logger="vgpu_driver.placement")
    assert sync_tests.run_cli(*args, "sync", conf=conf)[0] == 0
    assert (
        "Deleted provider cn1_pci_0000_41_00_0: its GPU 0000:41:00.0 has no VFs now "
        "(SR-IOV is off: run vgpu-manage sriov enable 0000:41:00.0) and nothing is "
        "allocated on it"
    ) in caplog.text


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_audit_says_no_drift_on_stdout_to_a_terminal_else_on_stderr(
    make_host, tmp_path, service, monkeypatch
):
    host = make_host("a100-sriov")
    args = (tmp_path, service, monkeypatch, host.paths.root)
    conf = "[devices]\nenabled_mdev_types = nvidia-468\n"
    assert sync_tests.run_cli(*args, "sync", conf=conf)[0] == 0
    code, out, err = sync_tests.run_cli(*args, "audit", conf=conf)
    # (The Placement this test runs in-process logs its requests there too.)
    assert (code, out, err.splitlines()[-1]) == (0, "", "no drift")
    monkeypatch.setattr("sys.stdout", Terminal())
    for key, value in service.cli_environment().items():
        monkeypatch.setenv(key, value)
    (tmp_path / "a.conf").write_text(conf)
    code = manage.main(
        [
            "--config-file",
            str(tmp_path / "a.conf"),
            "--nodename",
            "cn1",
            "--sysfs-root",
            host.paths.root,
            "--state-dir",
            str(tmp_path / "s"),
            "--libvirt-uri",
            "test:///default",
            "audit",
        ]
    )
    assert (code, sys.stdout.getvalue()) == (0, "no drift\n")


def test_an_empty_listing_prints_nothing(make_host, tmp_path, service, monkeypatch):
    host = make_host("t4x8")
    code, out, _ = sync_tests.run_cli(
        tmp_path, service, monkeypatch, host.paths.root, "types", "--parent", "0000:99:00.0"
    )
    assert (code, out) == (0, "")


def test_mdev_list_says_unknown_when_libvirt_is_unreachable(
    make_host, tmp_path, service, monkeypatch
):
    host = make_host("t4x8")
    host.create_mdev(T4[0], "nvidia-231", "11111111-2222-4333-8444-555555555555")
    claims_journal.Journal(str(tmp_path / "s"))
    code, out, _ = sync_tests.run_cli(
        tmp_path,
        service,
        monkeypatch,
        host.paths.root,
        "--libvirt-uri",
        "qemu+unix:///system?socket=/nonexistent",
        "mdev",
        "list",
        "-f",
        "json",
        "-c",
        "state",
    )
    assert (code, json.loads(out)) == (0, [{"state": "unknown"}])


def test_a_conflict_that_outlasts_the_retries_is_one_error_line(make_host, tmp_path, monkeypatch):
    injectors = []

    def middleware(app):
        injectors.append(FaultInjector(app))
        return injectors[0]

    with placement_service.EmbeddedPlacement(middleware=middleware) as faulty:
        injectors[0].conflict("PUT", r"/resource_providers/[0-9a-f-]+/inventories", times=None)
        code, out, err = sync_tests.run_cli(
            tmp_path,
            faulty,
            monkeypatch,
            make_host("a100-sriov").paths.root,
            "sync",
            conf="[devices]\nenabled_mdev_types = nvidia-468\n",
        )
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert (code, out) == (2, "") and "Traceback" not in err
    assert len(errors) == 1
    assert errors[0].startswith("error: Placement refused PUT /resource_providers/")
    assert "/inventories: HTTP 409" in errors[0]
