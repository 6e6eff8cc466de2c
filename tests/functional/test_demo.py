"""The README's first command: the demo, run as a real process."""

import subprocess
import sys


def test_demo_shows_the_flow_on_embedded_defaults(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "vgpu_driver.cmd.manage", "--config-file", "/dev/null",
         "demo", "--dir", str(tmp_path / "host")],
        capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "ok: 2 enabled type(s), 9 mdev-capable device(s) on this host" in out
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in out.splitlines() if line.startswith("| demo-host_pci_")}
    assert rows["demo-host_pci_0000_41_00_0"][:3] == ["nvidia-468", "10", "0"]
    assert rows["demo-host_pci_0000_e7_00_0"][:3] == ["nvidia-231", "4", "0"]
    assert rows["demo-host_pci_0000_f5_00_0"][:3] == ["nvidia-231", "8", "8"]
    assert "blocked by existing mdevs (1 of nvidia-222)" in out
    # The fake host was kept where asked, and plays /sys for anyone.
    assert (tmp_path / "host" / "sys" / "class" / "mdev_bus" / "0000:41:00.4").is_symlink()
