"""``[vgpu] metrics_textfile``: nova-compute's periodic update writes the
metrics of what it has just read; they are the numbers ``vgpu-manage
metrics`` reads on its own, and a file that cannot be written never costs
the update."""

import logging
import os

import pytest

from tests.unit import test_cli_metrics
from tests.unit import test_cli_status
from vgpu_driver import driver
from vgpu_driver import exception
from vgpu_driver import libvirt_host
from vgpu_driver import metrics
from vgpu_driver import metrics_textfile
from vgpu_driver.fake import fakekernel

busy_t4 = test_cli_status.busy_t4
cli = test_cli_status.cli
samples = test_cli_metrics.samples
# Series that move with the clock between two reads (ages and times).
CLOCKED = ("_seconds",)


def t4_driver(make_conf, host, tmp_path, uri, textfile):
    conf = make_conf(
        test_cli_status.T4_CONF
        + f"""
[vgpu]
sysfs_root = {host.paths.root}
state_dir = {tmp_path / "state"}
metrics_textfile = {textfile}
"""
    )
    return driver.VGPUDriver(
        conf, libvirt_host.LibvirtHost(uri), host=fakekernel.FakeKernel(host.paths.root)
    )


def unclocked(found):
    return {key: value for key, value in found.items() if not key[0].endswith(CLOCKED)}


def said(caplog, level):
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == metrics_textfile.LOG.logger.name and r.levelno == level
    ]


@pytest.fixture
def textfile_dir(tmp_path):
    path = tmp_path / "textfile_collector"
    path.mkdir()
    return path


def test_each_update_writes_what_vgpu_manage_metrics_reads(
    busy_t4, cli, make_conf, tmp_path, textfile_dir
):
    host, ids, inst, uri = busy_t4
    textfile = textfile_dir / "vgpu.prom"
    vgpu = t4_driver(make_conf, host, tmp_path, uri, textfile)
    umask = os.umask(0o027)  # a service's umask: node_exporter must still read it
    try:
        tree = vgpu.provider_tree("cn1")
        os.umask(umask)
        assert oct(textfile.stat().st_mode & 0o777) == "0o644"
        written = samples(textfile.read_text())
        code, out, err = cli("--sysfs-root", host.paths.root, "metrics", uri=uri)
        assert (code, err) == (0, "")
        assert unclocked(written) == unclocked(samples(out))
        # What the update reported is what the file says, GPU by GPU.
        capacity = test_cli_metrics.per_gpu(written, "vgpu_gpu_vgpus_capacity")
        assert capacity == {
            g.address: (tree.by_gpu(g.address).total if tree.by_gpu(g.address) else 0)
            for g in vgpu.manager.snapshot().gpus
        }
        assert (
            test_cli_metrics.value(
                written, "vgpu_gpu_vgpus_used", gpu="0000:18:00.0", type="nvidia-231"
            )
            == 3
        )
        assert test_cli_metrics.value(written, "vgpu_reconciler_up") == 1
        assert written[("vgpu_inventory_update_timestamp_seconds", frozenset())] > 0
        # The temporary file it renames over the metrics is gone.
        assert os.listdir(textfile_dir) == ["vgpu.prom"]
    finally:
        os.umask(umask)
        vgpu.close()


def test_a_file_it_cannot_write_is_logged_once_and_the_update_goes_on(
    busy_t4, make_conf, tmp_path, textfile_dir, caplog
):
    host, ids, inst, uri = busy_t4
    textfile = textfile_dir / "vgpu.prom"
    vgpu = t4_driver(make_conf, host, tmp_path, uri, textfile)
    caplog.set_level(logging.INFO, logger="vgpu_driver.metrics_textfile")
    try:
        first = vgpu.provider_tree("cn1")
        textfile_dir.rename(tmp_path / "moved")
        for _ in range(3):
            assert vgpu.provider_tree("cn1").providers == first.providers
        failures = said(caplog, logging.WARNING)
        assert failures == [
            f"Cannot write the metrics to {textfile}: No such file or "
            f"directory; the inventory update goes on without them"
        ]
        (tmp_path / "moved").rename(textfile_dir)
        vgpu.provider_tree("cn1")
        assert said(caplog, logging.INFO) == [f"The metrics are written to {textfile} again"]
        assert ("vgpu_scrape_success", frozenset()) in samples(textfile.read_text())
    finally:
        vgpu.close()


@pytest.mark.parametrize(
    "name, reason",
    [
        ("relative.prom", "give an absolute path"),
        ("{dir}/vgpu.txt", "reads only files named *.prom"),
        ("{dir}/.prom", "reads only files named *.prom"),
        ("{dir}/missing/vgpu.prom", "does not exist"),
    ],
)
def test_a_path_that_cannot_work_stops_the_driver_before_it_writes(
    make_host, make_conf, tmp_path, textfile_dir, name, reason
):
    host = make_host("t4x8")
    path = name.format(dir=textfile_dir)
    state = tmp_path / "state"
    conf = make_conf(
        test_cli_status.T4_CONF
        + f"""
[vgpu]
sysfs_root = {host.paths.root}
state_dir = {state}
metrics_textfile = {path}
"""
    )
    with pytest.raises(exception.InvalidConfiguration) as raised:
        driver.VGPUDriver(conf, None, host=fakekernel.FakeKernel(host.paths.root))
    assert str(raised.value).startswith(
        f"Invalid vGPU configuration:\n  error: [vgpu] metrics_textfile = '{path}': "
    )
    assert reason in str(raised.value)
    assert not state.exists()


def test_a_directory_is_not_a_file(textfile_dir):
    (textfile_dir / "vgpu.prom").mkdir()
    [problem] = metrics_textfile.problems(str(textfile_dir / "vgpu.prom"))
    assert problem.reason == "it is a directory; name a file in it"
    assert metrics_textfile.problems("") == []
    assert metrics_textfile.problems(str(textfile_dir / "ok.prom")) == []


def test_metrics_that_cannot_be_computed_never_fail_the_update(
    busy_t4, make_conf, tmp_path, textfile_dir, caplog, monkeypatch
):
    host, ids, inst, uri = busy_t4
    vgpu = t4_driver(make_conf, host, tmp_path, uri, textfile_dir / "vgpu.prom")

    def broken(*args):
        raise RuntimeError("a bug in the metrics")

    monkeypatch.setattr(metrics, "build_reading", broken)
    try:
        assert vgpu.provider_tree("cn1").providers
        assert not (textfile_dir / "vgpu.prom").exists()
        [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert record.getMessage().startswith("Cannot compute the metrics for ")
        assert "a bug in the metrics" in caplog.text
    finally:
        vgpu.close()
