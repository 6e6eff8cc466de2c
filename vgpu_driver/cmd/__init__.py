"""Operator commands (``vgpu-manage``)."""
