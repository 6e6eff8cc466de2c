"""``claims drop``: an operator's way out for claims nothing will settle
(real CLI in-process, fake kernel, real journal, libvirt's test driver)."""

import contextlib
import io
import json
import uuid

import pytest

from tests import libvirt_domains
from vgpu_driver import claims
from vgpu_driver import claims_journal
from vgpu_driver.cmd import base
from vgpu_driver.cmd import manage

A100 = "0000:41:00.0"
CONF = "[devices]\nenabled_mdev_types = nvidia-468\n"


class Host:
    """A fake A100 with mdevs, their claims, and libvirt domains using some."""

    def __init__(self, make_host, tmp_path):
        self.tmp_path = tmp_path
        self.kernel = make_host("a100-sriov")
        self.state = tmp_path / "state"
        self.journal = claims_journal.Journal(str(self.state))
        self.domains = []
        self.vfs = iter(range(4, 20))

    def claim(self, instance, state, domain=None):
        """One mdev claimed for ``instance``; ``domain``: the name of a
        domain using it."""
        mdev, parent = str(uuid.uuid4()), f"0000:41:00.{next(self.vfs)}"
        self.kernel.create_mdev(parent, "nvidia-468", mdev)
        with self.journal.transaction() as txn:
            txn.add(instance, mdev, A100, parent, "nvidia-468", state=state, created=True)
        if domain:
            self.domains.append(libvirt_domains.domain_xml(domain, [mdev], instance))
        return mdev

    def rows(self):
        return sorted((c.instance_uuid, c.mdev_uuid, c.state) for c in self.journal.claims())

    def cli(self, *argv):
        conf_file = self.tmp_path / "nova.conf"
        conf_file.write_text(CONF)
        uri = libvirt_domains.node_file(self.tmp_path / "node.xml", self.domains)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = manage.main(
                [
                    "--config-file",
                    str(conf_file),
                    "--nodename",
                    "cn1",
                    "--sysfs-root",
                    self.kernel.paths.root,
                    "--state-dir",
                    str(self.state),
                    "--libvirt-uri",
                    uri,
                    "claims",
                    "drop",
                    *argv,
                ]
            )
        return code, out.getvalue(), err.getvalue()


@pytest.fixture
def host(make_host, tmp_path, fake_kernel_cli):
    return Host(make_host, tmp_path)


def ids():
    return sorted(str(uuid.uuid4()) for _ in range(3))


def test_a_dry_run_changes_nothing_and_says_would(host):
    dead, alive, booting = ids()
    stuck = host.claim(dead, claims.MIGRATING_IN)
    host.claim(alive, claims.ATTACHED, domain="alive")
    host.claim(booting, claims.CLAIMED)
    before = host.rows()
    code, out, err = host.cli("--claim-state", "migrating_in", "-f", "json")
    assert code == 0
    assert [
        (r["instance"], r["vgpu"], r["gpu"], r["type"], r["state"], r["result"], r["reason"])
        for r in json.loads(out)
    ] == [(dead, stuck, A100, "nvidia-468", "migrating_in", "would-drop", None)]
    assert err == "would drop 1 claim(s); run again with --yes\n"
    assert host.rows() == before


def test_yes_drops_what_the_selectors_all_select_and_leaves_the_mdev(host):
    dead, other, booting = ids()
    first = host.claim(dead, claims.MIGRATING_IN)
    second = host.claim(dead, claims.MIGRATING_IN)
    kept = host.claim(other, claims.MIGRATING_IN)
    host.claim(booting, claims.CLAIMED)
    before = host.rows()
    code, out, err = host.cli(
        "--instance", dead, "--claim-state", "migrating_in", "--yes", "-f", "json"
    )
    assert code == 0, err
    assert sorted((r["vgpu"], r["result"]) for r in json.loads(out)) == sorted(
        [(first, "dropped"), (second, "dropped")]
    )
    assert err == "dropped 2 claim(s)\n"
    assert host.rows() == [r for r in before if r[0] != dead]
    assert {kept, first, second} <= {m.uuid for m in host.kernel.list_mdevs()}


def test_selectors_are_repeatable_and_a_vgpu_selects_its_claim(host):
    one, two, three = ids()
    mdev_one = host.claim(one, claims.CLAIMED)
    host.claim(two, claims.CLAIMED)
    mdev_three = host.claim(three, claims.RELEASING)
    code, out, _ = host.cli(
        "--vgpu", mdev_one, "--vgpu", mdev_three, "--yes", "-f", "value", "-c", "vgpu"
    )
    assert code == 0
    assert sorted(out.split()) == sorted([mdev_one, mdev_three])
    assert [r[0] for r in host.rows()] == [two]


def test_a_claim_a_domain_uses_is_refused_and_the_others_dropped(host):
    gone, alive = ids()[:2]
    stale = host.claim(gone, claims.MIGRATING_IN)
    used = host.claim(alive, claims.MIGRATING_IN, domain="arrived")
    code, out, err = host.cli("--claim-state", "migrating_in", "--yes", "-f", "json")
    assert code == base.EXIT_PROBLEMS
    assert sorted((r["vgpu"], r["result"], r["reason"]) for r in json.loads(out)) == sorted(
        [(stale, "dropped", None), (used, "refused", "domain arrived uses it")]
    )
    assert err == ("dropped 1 claim(s); refused 1 claim(s) whose vGPU a libvirt domain uses\n")
    assert host.rows() == [(alive, used, claims.MIGRATING_IN)]


def test_a_dry_run_refuses_the_same_rows(host):
    (alive,) = ids()[:1]
    used = host.claim(alive, claims.ATTACHED, domain="web")
    code, out, err = host.cli("--instance", alive)
    assert code == base.EXIT_PROBLEMS
    assert "refused" in out and "domain web uses it" in out
    assert err == "would drop 0 claim(s); refused 1 claim(s) whose vGPU a libvirt domain uses\n"
    assert host.rows() == [(alive, used, claims.ATTACHED)]


def test_nothing_selected_is_not_an_error(host):
    host.claim(ids()[0], claims.CLAIMED)
    before = host.rows()
    code, out, err = host.cli("--instance", str(uuid.uuid4()), "--yes")
    assert (code, out, err) == (0, "", "no claim matches\n")
    assert host.rows() == before


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            (),
            "error: claims drop '': give --instance, --vgpu or --claim-state; it never drops every "
            "claim\n",
        ),
        (
            ("--yes",),
            "error: claims drop '': give --instance, --vgpu or --claim-state; it never "
            "drops every claim\n",
        ),
        (
            ("--instance", "../etc", "--yes"),
            "error: --instance '../etc': not an instance UUID (lower-case, 8-4-4-4-12 hex "
            "digits)\n",
        ),
        (
            ("--instance", "6F9619FF-8B86-D011-B42D-00C04FC964FF"),
            "error: --instance '6F9619FF-8B86-D011-B42D-00C04FC964FF': not an instance UUID "
            "(lower-case, 8-4-4-4-12 hex digits)\n",
        ),
        (
            ("--vgpu", "nvidia-468", "--yes"),
            "error: --vgpu 'nvidia-468': not a vGPU id (an mdev UUID, lower-case, or a VF's PCI "
            "address dddd:bb:ss.f)\n",
        ),
        (
            ("--claim-state", "attatched", "--yes"),
            "error: --claim-state 'attatched': not a claim state (claimed, attached, migrating_in, "
            "releasing)\n",
        ),
    ],
)
def test_bad_selections_are_refused_before_anything_is_read(host, argv, message):
    host.claim(ids()[0], claims.CLAIMED)
    before = host.rows()
    code, out, err = host.cli(*argv)
    assert (code, out, err) == (base.EXIT_ERROR, "", message)
    assert host.rows() == before


def test_without_a_journal_nothing_is_created(host, tmp_path):
    host.state = tmp_path / "sate"
    code, out, err = host.cli("--claim-state", "claimed", "--yes")
    assert (code, out) == (base.EXIT_ERROR, "")
    assert err.startswith(f"error: No claims journal at {tmp_path}/sate/claims.sqlite")
    assert err.count("\n") == 1 and not (tmp_path / "sate").exists()


def test_without_libvirt_nothing_is_dropped(host, tmp_path):
    host.claim(ids()[0], claims.CLAIMED)
    before = host.rows()
    conf_file = tmp_path / "nova.conf"
    conf_file.write_text(CONF)
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = manage.main(
            [
                "--config-file",
                str(conf_file),
                "--sysfs-root",
                host.kernel.paths.root,
                "--state-dir",
                str(host.state),
                "--libvirt-uri",
                f"test://{tmp_path}/no-such-node.xml",
                "claims",
                "drop",
                "--claim-state",
                "claimed",
                "--yes",
            ]
        )
    assert code == base.EXIT_ERROR
    assert err.getvalue().startswith("error: ") and err.getvalue().count("\n") == 1
    assert host.rows() == before
