"""``sriov sizes``: whether a vendor-VFIO board mixes vGPU sizes.

NVIDIA's mode of the board (``nvidia-smi vgpu -shm``), which ``sriov
status`` shows and ``sriov enable`` sets on the boards configured for
several sizes.
"""

from vgpu_driver import discovery
from vgpu_driver import exception
from vgpu_driver import host_snapshot
from vgpu_driver import sriov_functions
from vgpu_driver.cmd import base

SIZES_EQUAL, SIZES_MIXED, SIZES_UNKNOWN = "equal", "mixed", "unknown"


def vgpu_sizes(host, snapshot, address, warn):
    """``equal`` or ``mixed`` for a board whose VFs serve vendor-VFIO vGPUs
    (NVML's mode), None for any other; ``unknown`` when NVML cannot say,
    and ``warn(text)`` says why."""
    gpu = snapshot.gpu(address)
    if gpu is None or gpu.mode != host_snapshot.MODE_VENDOR_VFIO:
        return None
    try:
        return SIZES_MIXED if host.mixed_sizes(address) else SIZES_EQUAL
    except (exception.NvmlUnavailable, exception.MixedSizeModeRefused) as exc:
        warn(f"cannot read the vGPU size mode of {address}: {exc}")
        return SIZES_UNKNOWN


class Sizes(base.Command):
    """Switch a vendor-VFIO board between equal-size and mixed-size vGPUs.

    NVIDIA's mode (nvidia-smi vgpu -shm): NVML refuses it while any vGPU
    exists on the board, and the board forgets it when its VFs are disabled
    or enabled, or the host reboots.
    """

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument(
            "address", metavar="ADDRESS", help="Physical function PCI address (dddd:bb:ss.f)."
        )
        parser.add_argument(
            "sizes",
            choices=(SIZES_MIXED, SIZES_EQUAL),
            help="mixed: vGPUs of several framebuffer sizes on the board; "
            "equal: of one size (NVIDIA's default).",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Check and say what would be switched; switch nothing.",
        )
        return parser

    def take_action(self, parsed_args):
        host = self.app.open_host()
        pf = sriov_functions.function(host, parsed_args.address, "switch the vGPU sizes of")
        snapshot = discovery.discover(host)
        gpu = snapshot.gpu(pf.address)
        if gpu is None or gpu.mode != host_snapshot.MODE_VENDOR_VFIO:
            raise exception.SriovRefused(
                action="switch the vGPU sizes of",
                address=pf.address,
                reason="its VFs serve no vendor-VFIO vGPUs (they are off: run vgpu-manage "
                "sriov enable first; or the board serves mdevs, which do not mix "
                "sizes)",
            )
        wanted = parsed_args.sizes == SIZES_MIXED
        if host.mixed_sizes(pf.address) == wanted:
            self.app.stdout.write(f"{pf.address}: already {parsed_args.sizes} sizes, left alone\n")
            return base.EXIT_OK
        busy = [vf.address for vf in pf.vfs if vf.busy]
        if busy:
            raise exception.SriovRefused(
                action="switch the vGPU sizes of",
                address=pf.address,
                reason=f"VFs {', '.join(busy)} hold vGPUs; the mode changes only on a "
                "board without any",
            )
        if parsed_args.dry_run:
            self.app.stdout.write(f"{pf.address}: would switch to {parsed_args.sizes} sizes\n")
            return base.EXIT_OK
        host.set_mixed_sizes(pf.address, wanted)
        self.app.stdout.write(
            f"{pf.address}: switched to {parsed_args.sizes} sizes (until "
            "its VFs are disabled or enabled again, or the host reboots)\n"
        )
        return base.EXIT_OK
