"""The committed sample config is what the generator writes today."""

import pathlib
import subprocess
import sys

TOP = pathlib.Path(__file__).resolve().parents[2]
SAMPLE = TOP / "etc" / "vgpu-driver" / "vgpu-driver.conf.sample"


def test_sample_is_up_to_date_and_documents_the_dynamic_groups(tmp_path):
    out = tmp_path / "sample.conf"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "oslo_config.generator",
            "--namespace",
            "vgpu_driver",
            "--wrap-width",
            "79",
            "--output-file",
            str(out),
        ],
        check=True,
    )
    generated = out.read_text()
    assert generated == SAMPLE.read_text(), "run 'tox -e genconfig' and commit the sample"
    for expected in (
        "[devices]",
        "#enabled_mdev_types =",
        "[mdev_<type>]",
        "#device_addresses =",
        "#mdev_class = VGPU",
        "#max_instances",
        "[vgpu]",
        "#sysfs_root = /sys",
        "#state_dir",
    ):
        assert expected in generated
