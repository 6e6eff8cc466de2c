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
    before, after = out.split("==> booting guests")
    assert "| 7f5a0e0c-3a59-4b7e-9f65-2bb1d1f1e0aa | 0000:35:00.0 | nvidia-222 | stale-type |" \
        in before
    assert "7f5a0e0c-3a59-4b7e-9f65-2bb1d1f1e0aa (nvidia-222 on 0000:35:00.0): removed" \
        in before

    def inventory(text):
        return {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
                for line in text.splitlines() if line.startswith("| demo-host_pci_")}

    assert inventory(before)["demo-host_pci_0000_35_00_0"][:3] == ["nvidia-231", "8", "8"]
    assert "blocked by unused mdevs (1 of nvidia-222); they are reclaimed automatically" \
        in before
    rows = inventory(after)
    assert rows["demo-host_pci_0000_35_00_0"][:3] == ["nvidia-231", "8", "0"]
    assert rows["demo-host_pci_0000_41_00_0"][:3] == ["nvidia-468", "10", "0"]
    assert rows["demo-host_pci_0000_e7_00_0"][:3] == ["nvidia-231", "4", "0"]
    assert rows["demo-host_pci_0000_e8_00_0"][:3] == ["nvidia-231", "8", "8"]
    # Three guests, four mdevs, each attached to its instance.
    assert after.count("| attached |") == 4
    assert "render-1" in after and "2 x nvidia-231 on 0000:18:00.0" in after
    # The fake host was kept where asked, and plays /sys for anyone.
    assert (tmp_path / "host" / "sys" / "class" / "mdev_bus" / "0000:41:00.4").is_symlink()
