"""NVIDIA constants the simulator reproduces: XID codes and clock throttle-reason bits.

XID meanings follow NVIDIA's "XID Errors" catalogue (docs.nvidia.com/deploy/xid-errors). The
throttle-reason bits are NVML's `nvmlClocksThrottleReason*` / `nvmlClocksEventReason*` values
(checked against pynvml.py of nvidia-ml-py), so a detector written against real NVML bitmasks
reads simulated ones the same way.
"""

from __future__ import annotations

# ---------------------------------------------------------------- XIDs (kernel driver error events)
XID_GRAPHICS_ENGINE_EXCEPTION = 13  # often an application bug (bad kernel), sometimes hardware
XID_GPU_MEMORY_PAGE_FAULT = 31  # illegal address; usually the application
XID_GPU_STOPPED_PROCESSING = 43  # the GPU stopped processing the user channel
XID_DOUBLE_BIT_ECC = 48  # uncorrectable (double bit) ECC error
XID_ROW_REMAP_EVENT = 63  # ECC page retirement or row-remapping recording event
XID_ROW_REMAP_FAILURE = 64  # ECC page retirement or row-remapper recording failure
XID_NVLINK_ERROR = 74  # NVLink error (CRC/replay beyond threshold, link down)
XID_FALLEN_OFF_BUS = 79  # GPU has fallen off the bus: NVML can no longer reach it
XID_CONTAINED_ECC = 94  # contained uncorrectable ECC: only the affected application must restart
XID_UNCONTAINED_ECC = 95  # uncontained uncorrectable ECC: every application on the GPU; GPU reset needed
XID_GSP_RPC_TIMEOUT = 119  # timeout waiting for an RPC from the GPU System Processor

# ---------------------------------------------------------------- throttle (clock event) reasons
THROTTLE_GPU_IDLE = 0x1
THROTTLE_APPLICATIONS_CLOCKS = 0x2
THROTTLE_SW_POWER_CAP = 0x4  # benign and common on a fully loaded H100: power management at the limit
THROTTLE_HW_SLOWDOWN = 0x8
THROTTLE_SYNC_BOOST = 0x10
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80
