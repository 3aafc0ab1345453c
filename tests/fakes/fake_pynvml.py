"""A fake of pynvml (nvidia-ml-py) for tests: the same names, constants, return types and errors.

It never imports pynvml; tests/unit/test_collector_nvml.py checks its names and values against the
installed bindings so the two cannot drift apart. Typical use:

    fake = FakeNvml([FakeGpu(util=50, temp_c=70)] * 8)   # each GPU is copied: no shared state
    src = NvmlSource(nvml=fake.module)                   # fake.module is a real ModuleType
    fake.gpus[3].power_mw = None                          # None -> that call raises NVMLError_NotSupported
    fake.inject_xid(2, 48)                                # an XID event on GPU 2
    fake.lose(5)                                          # GPU 5 falls off the bus (XID 79)

Per GPU, `errors` maps an NVML function name to the error code it raises, and `hangs` names
functions that block until `fake.release()` (or `hang_timeout_s`, so a test can never hang CI).
"""

from __future__ import annotations

import copy
import ctypes
import string
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, ClassVar

# ---------------------------------------------------------------- constants (as in pynvml 13.x)

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_FREQ_NOT_SUPPORTED = 24
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30
NVML_ERROR_UNKNOWN = 999

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1

NVML_TEMPERATURE_GPU = 0

NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_CLOCK_VIDEO = 3

NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1

NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1

NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_NVLINK_ERROR_DL_CRC_DATA = 3

# nvmlDeviceGetFieldValues: the types a field's value comes in (nvmlValueType_t), the one field
# this fake models and its values (nvml.h: nvmlDeviceGpuRecoveryAction_t)
NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG = 2
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4
NVML_VALUE_TYPE_SIGNED_INT = 5
NVML_VALUE_TYPE_UNSIGNED_SHORT = 6
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
NVML_GPU_RECOVERY_ACTION_NONE = 0
NVML_GPU_RECOVERY_ACTION_GPU_RESET = 1
NVML_GPU_RECOVERY_ACTION_NODE_REBOOT = 2
NVML_GPU_RECOVERY_ACTION_DRAIN_P2P = 3
NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET = 4

nvmlEventTypeSingleBitEccError = 0x0000000000000001
nvmlEventTypeDoubleBitEccError = 0x0000000000000002
nvmlEventTypePState = 0x0000000000000004
nvmlEventTypeXidCriticalError = 0x0000000000000008
nvmlEventTypeClock = 0x0000000000000010

# What the real NVML puts in gpuInstanceId / computeInstanceId of an event outside MIG.
_NO_INSTANCE = 0xFFFFFFFF


# ---------------------------------------------------------------- errors (built like pynvml's)


class NVMLError(Exception):
    """Mirrors pynvml.NVMLError: NVMLError(code) returns the subclass for that code, `.value` is the code."""

    _valClassMapping: ClassVar[dict[int, type[NVMLError]]] = {}  # same name and shape as pynvml's

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    value: int

    def __str__(self) -> str:
        return _ERROR_STRINGS.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:  # pynvml compares errors by code (and so is unhashable)
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = None  # type: ignore[assignment]


_ERROR_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


def _error_class_name(constant: str) -> str:
    # pynvml's own rule: NVML_ERROR_GPU_IS_LOST -> NVMLError_GpuIsLost
    return "NVMLError_" + string.capwords(constant.replace("NVML_ERROR_", ""), "_").replace("_", "")


def _make_error_classes() -> dict[str, type[NVMLError]]:
    classes: dict[str, type[NVMLError]] = {}
    for const, code in sorted(globals().items()):
        if not const.startswith("NVML_ERROR_"):
            continue

        def new(cls: type[NVMLError], *args: Any, _code: int = code) -> NVMLError:
            return NVMLError.__new__(cls, _code)

        cls = type(_error_class_name(const), (NVMLError,), {"__new__": new, "__module__": __name__})
        NVMLError._valClassMapping[code] = cls
        classes[cls.__name__] = cls
    return classes


ERROR_CLASSES = _make_error_classes()
globals().update(ERROR_CLASSES)  # NVMLError_NotSupported, NVMLError_Timeout, NVMLError_GpuIsLost, ...
NVMLError_NotSupported: type[NVMLError]
NVMLError_Timeout: type[NVMLError]
NVMLError_GpuIsLost: type[NVMLError]


# ---------------------------------------------------------------- return types (same attribute names)


@dataclass(frozen=True)
class c_nvmlUtilization_t:
    gpu: int
    memory: int


@dataclass(frozen=True)
class c_nvmlMemory_t:
    total: int
    free: int
    used: int


@dataclass(frozen=True)
class c_nvmlEventData_t:
    device: Any
    eventType: int
    eventData: int
    gpuInstanceId: int
    computeInstanceId: int


class c_nvmlValue_t(ctypes.Union):
    """nvmlValue_t: a C union like pynvml's, so reading a member other than the one valueType names
    reinterprets the same bytes, as it does with the real bindings."""

    _fields_ = [
        ("dVal", ctypes.c_double),
        ("uiVal", ctypes.c_uint),
        ("ulVal", ctypes.c_ulong),
        ("ullVal", ctypes.c_ulonglong),
        ("sllVal", ctypes.c_longlong),
        ("siVal", ctypes.c_int),
        ("usVal", ctypes.c_ushort),
    ]


class c_nvmlFieldValue_t(ctypes.Structure):
    """nvmlFieldValue_t, laid out as in pynvml; `value` is valid only when nvmlReturn is NVML_SUCCESS."""

    _fields_ = [
        ("fieldId", ctypes.c_uint32),
        ("scopeId", ctypes.c_uint32),
        ("timestamp", ctypes.c_int64),
        ("latencyUsec", ctypes.c_int64),
        ("valueType", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", c_nvmlValue_t),
    ]


# nvmlValueType_t -> the union member that holds a value of that type
_VALUE_MEMBER = {
    NVML_VALUE_TYPE_DOUBLE: "dVal",
    NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


class FakeHandle:
    """Opaque like c_nvmlDevice_t: compared by identity, carries its index for the fake only."""

    def __init__(self, index: int) -> None:
        self._index = index

    def __repr__(self) -> str:
        return f"<FakeHandle gpu {self._index}>"


class FakeEventSet:
    def __init__(self) -> None:
        self.queue: deque[c_nvmlEventData_t] = deque()
        self.cond = threading.Condition()
        self.freed = False


# ---------------------------------------------------------------- configuration


@dataclass
class FakeLink:
    """One NVLink; a counter set to None is not supported (raises NVMLError_NotSupported)."""

    active: bool = True
    crc_flit: int | None = 0
    crc_data: int | None = 0
    replay: int | None = 0
    recovery: int | None = 0


@dataclass
class FakeGpu:
    """One GPU. Any value set to None makes its NVML call raise NVMLError_NotSupported."""

    uuid: str | None = None  # None: a UUID is made up from the index
    util: int | None = 0
    mem_util: int | None = 0
    mem_total_bytes: int = 80 * 2**30
    mem_used_bytes: int | None = 0
    temp_c: int | None = 40
    power_mw: int | None = 100_000
    sm_clock_mhz: int | None = 1980
    clocks_event_reasons: int | None = 0
    ecc_sbe_volatile: int | None = 0
    ecc_dbe_volatile: int | None = 0
    ecc_sbe_aggregate: int | None = 0
    ecc_dbe_aggregate: int | None = 0
    retired_pages_sbe: list[int] | None = field(default_factory=list)  # page addresses
    retired_pages_dbe: list[int] | None = field(default_factory=list)
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)  # (corr, unc, isPending, failureOccurred)
    nvlinks: list[FakeLink] = field(default_factory=list)  # empty: the GPU has no NVLink (NotSupported)
    pcie_replay: int | None = 0
    # PCIe link, by default an H100 SXM5's (Gen5 x16). `_max` is what this GPU and its slot allow
    # (nvmlDeviceGetMaxPcieLinkGeneration/Width), `pcie_link_gen_gpu_max` the GPU alone
    # (nvmlDeviceGetGpuMaxPcieLinkGeneration): a Gen5 GPU in a Gen4 slot has 4 and 5.
    pcie_link_gen: int | None = 5
    pcie_link_gen_max: int | None = 5
    pcie_link_gen_gpu_max: int | None = 5
    pcie_link_width: int | None = 16
    pcie_link_width_max: int | None = 16
    # nvmlDeviceGetFieldValues: NVML_FI_DEV_GET_GPU_RECOVERY_ACTION's value (an unsigned int), None:
    # the field answers NOT_SUPPORTED (drivers before it). `field_values` gives any field id a value
    # of a type of its own, (valueType, value); `field_errors` a field id its own nvmlReturn.
    recovery_action: int | None = 0
    field_values: dict[int, tuple[int, int | float]] = field(default_factory=dict)
    field_errors: dict[int, int] = field(default_factory=dict)
    xid_events_supported: bool = True  # False: nvmlDeviceRegisterEvents raises NotSupported
    lost: bool = False  # every call on this GPU raises NVMLError_GpuIsLost
    errors: dict[str, int] = field(default_factory=dict)  # function name -> NVML error code it raises
    hangs: set[str] = field(default_factory=set)  # function names that block until FakeNvml.release()


def _unsupported(value: Any) -> Any:
    if value is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return value


# ---------------------------------------------------------------- the fake library


class FakeNvml:
    """The state of a fake NVML library; `module` is what the code under test imports as pynvml."""

    # The NVML API this fake implements: each is a method of this class with the real name.
    API = (
        "nvmlInit",
        "nvmlShutdown",
        "nvmlErrorString",
        "nvmlDeviceGetCount",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetNvLinkErrorCounter",
        "nvmlDeviceGetPcieReplayCounter",
        "nvmlDeviceGetCurrPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetGpuMaxPcieLinkGeneration",
        "nvmlDeviceGetCurrPcieLinkWidth",
        "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetFieldValues",
        "nvmlEventSetCreate",
        "nvmlDeviceRegisterEvents",
        "nvmlEventSetWait_v2",
        "nvmlEventSetWait",
        "nvmlEventSetFree",
    )

    def __init__(
        self,
        gpus: Sequence[FakeGpu] = (),
        *,
        init_error: int | None = None,
        without: Iterable[str] = (),
        hang_timeout_s: float = 30.0,
    ) -> None:
        """`init_error`: code nvmlInit raises (e.g. NVML_ERROR_DRIVER_NOT_LOADED); `without`: API
        names left out of the module, as in older bindings; `hang_timeout_s`: the longest a hang lasts."""
        self.gpus = [copy.deepcopy(g) for g in gpus]  # `[FakeGpu()] * 8` must give 8 independent GPUs
        for i, gpu in enumerate(self.gpus):
            if gpu.uuid is None:
                gpu.uuid = f"GPU-fa4e0000-0000-4000-8000-{i:012x}"
        self.init_error = init_error
        self.hang_timeout_s = hang_timeout_s
        self.calls: Counter[str] = Counter()  # API name -> number of calls
        self.init_count = 0  # NVML's reference count: nvmlInit +1, nvmlShutdown -1
        self.event_sets: list[FakeEventSet] = []
        self._handles = [FakeHandle(i) for i in range(len(self.gpus))]
        self._registrations: list[tuple[int, int, FakeEventSet]] = []  # (gpu index, event mask, set)
        self._released = threading.Event()
        self.hanging = threading.Event()  # set while some call is blocked in a hang
        self.module = self._build_module(set(without))

    # ------------------------------------------------------------ test controls

    def inject_xid(self, index: int, *xids: int) -> None:
        """XID critical-error events on GPU `index`, delivered to the event sets registered for it."""
        for gpu_index, mask, events in self._registrations:
            if gpu_index != index or not mask & nvmlEventTypeXidCriticalError:
                continue
            with events.cond:
                for xid in xids:
                    events.queue.append(
                        c_nvmlEventData_t(
                            self._handles[index],
                            nvmlEventTypeXidCriticalError,
                            xid,
                            _NO_INSTANCE,
                            _NO_INSTANCE,
                        )
                    )
                events.cond.notify_all()

    def lose(self, index: int, xid: int | None = 79) -> None:
        """GPU `index` falls off the bus: XID `xid` is raised, then every call answers GPU_IS_LOST."""
        if xid is not None:
            self.inject_xid(index, xid)
        self.gpus[index].lost = True

    def release(self) -> None:
        """Unblock every hung call (and all later ones)."""
        self._released.set()

    # ------------------------------------------------------------ plumbing

    def _build_module(self, without: set[str]) -> ModuleType:
        module = ModuleType("fake_pynvml", "fake pynvml built by tests.fakes.fake_pynvml.FakeNvml")
        this = sys.modules[__name__]
        for name in dir(this):
            if name.startswith(("NVML_", "nvmlEventType", "NVMLError")) or name.startswith("c_nvml"):
                setattr(module, name, getattr(this, name))
        for name in self.API:
            if name not in without:
                setattr(module, name, getattr(self, name))
        return module

    def _check_init(self) -> None:
        if self.init_count <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _device(self, handle: Any, function: str) -> FakeGpu:
        """What every device call does first: count, check init, hang, lost, configured error."""
        self.calls[function] += 1
        self._check_init()
        if not isinstance(handle, FakeHandle):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[handle._index]
        if function in gpu.hangs and not self._released.is_set():
            self.hanging.set()
            self._released.wait(self.hang_timeout_s)
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if function in gpu.errors:
            raise NVMLError(gpu.errors[function])
        return gpu

    # ------------------------------------------------------------ library

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.init_count += 1

    def nvmlShutdown(self) -> None:
        self.calls["nvmlShutdown"] += 1
        self._check_init()
        self.init_count -= 1

    def nvmlErrorString(self, result: int) -> str:
        return _ERROR_STRINGS.get(result, "Unknown Error")

    def nvmlDeviceGetCount(self) -> int:
        self.calls["nvmlDeviceGetCount"] += 1
        self._check_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self.calls["nvmlDeviceGetHandleByIndex"] += 1
        self._check_init()
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[index]
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if "nvmlDeviceGetHandleByIndex" in gpu.errors:
            raise NVMLError(gpu.errors["nvmlDeviceGetHandleByIndex"])
        return self._handles[index]

    # ------------------------------------------------------------ device queries

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return str(self._device(handle, "nvmlDeviceGetUUID").uuid)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> c_nvmlUtilization_t:
        gpu = self._device(handle, "nvmlDeviceGetUtilizationRates")
        return c_nvmlUtilization_t(gpu=_unsupported(gpu.util), memory=_unsupported(gpu.mem_util))

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> c_nvmlMemory_t:
        gpu = self._device(handle, "nvmlDeviceGetMemoryInfo")
        used = _unsupported(gpu.mem_used_bytes)
        return c_nvmlMemory_t(total=gpu.mem_total_bytes, free=gpu.mem_total_bytes - used, used=used)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._device(handle, "nvmlDeviceGetTemperature")
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return _unsupported(gpu.temp_c)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return _unsupported(self._device(handle, "nvmlDeviceGetPowerUsage").power_mw)

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:  # `type`: pynvml's parameter name
        gpu = self._device(handle, "nvmlDeviceGetClockInfo")
        if type != NVML_CLOCK_SM:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # the fake only models the SM clock
        return _unsupported(gpu.sm_clock_mhz)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return _unsupported(
            self._device(handle, "nvmlDeviceGetCurrentClocksEventReasons").clocks_event_reasons
        )

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetCurrentClocksThrottleReasons")
        return _unsupported(gpu.clocks_event_reasons)

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        gpu = self._device(handle, "nvmlDeviceGetTotalEccErrors")
        kind = {NVML_MEMORY_ERROR_TYPE_CORRECTED: "sbe", NVML_MEMORY_ERROR_TYPE_UNCORRECTED: "dbe"}
        scope = {NVML_VOLATILE_ECC: "volatile", NVML_AGGREGATE_ECC: "aggregate"}
        if errorType not in kind or counterType not in scope:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return _unsupported(getattr(gpu, f"ecc_{kind[errorType]}_{scope[counterType]}"))

    def nvmlDeviceGetRetiredPages(self, device: Any, sourceFilter: int) -> list[int]:
        gpu = self._device(device, "nvmlDeviceGetRetiredPages")
        pages = {
            NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS: gpu.retired_pages_sbe,
            NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: gpu.retired_pages_dbe,
        }
        if sourceFilter not in pages:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return list(_unsupported(pages[sourceFilter]))

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        return tuple(_unsupported(self._device(device, "nvmlDeviceGetRemappedRows").remapped_rows))

    def _link(self, device: Any, function: str, link: int) -> FakeLink:
        gpu = self._device(device, function)
        if not gpu.nvlinks:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < len(gpu.nvlinks):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return gpu.nvlinks[link]

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        state = self._link(device, "nvmlDeviceGetNvLinkState", link)
        return NVML_FEATURE_ENABLED if state.active else NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, device: Any, link: int, counter: int) -> int:
        nvlink = self._link(device, "nvmlDeviceGetNvLinkErrorCounter", link)
        field_by_counter = {
            NVML_NVLINK_ERROR_DL_REPLAY: "replay",
            NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
            NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit",
            NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data",
        }
        if counter not in field_by_counter:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return _unsupported(getattr(nvlink, field_by_counter[counter]))

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return _unsupported(self._device(handle, "nvmlDeviceGetPcieReplayCounter").pcie_replay)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return _unsupported(self._device(handle, "nvmlDeviceGetCurrPcieLinkGeneration").pcie_link_gen)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return _unsupported(self._device(handle, "nvmlDeviceGetMaxPcieLinkGeneration").pcie_link_gen_max)

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, handle: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetGpuMaxPcieLinkGeneration")
        return _unsupported(gpu.pcie_link_gen_gpu_max)

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return _unsupported(self._device(handle, "nvmlDeviceGetCurrPcieLinkWidth").pcie_link_width)

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return _unsupported(self._device(handle, "nvmlDeviceGetMaxPcieLinkWidth").pcie_link_width_max)

    def nvmlDeviceGetFieldValues(
        self, handle: Any, fieldIds: Sequence[Any]
    ) -> ctypes.Array[c_nvmlFieldValue_t]:
        """As pynvml: an array of c_nvmlFieldValue_t, one per id (an id or an (id, scopeId) pair),
        each with its own nvmlReturn; the call itself fails only as a whole (lost GPU, `errors`)."""
        gpu = self._device(handle, "nvmlDeviceGetFieldValues")
        values = (c_nvmlFieldValue_t * len(fieldIds))()
        now_us = int(time.time() * 1e6)
        for i, field_id in enumerate(fieldIds):
            entry = values[i]
            try:
                entry.fieldId, entry.scopeId = field_id
            except TypeError:
                entry.fieldId = field_id
            entry.timestamp = now_us
            entry.nvmlReturn = NVML_SUCCESS
            if entry.fieldId in gpu.field_errors:
                entry.nvmlReturn = gpu.field_errors[entry.fieldId]
            elif entry.fieldId in gpu.field_values:
                entry.valueType, value = gpu.field_values[entry.fieldId]
                # a type no member is named for: its bits in the widest member
                setattr(entry.value, _VALUE_MEMBER.get(entry.valueType, "ullVal"), value)
            elif entry.fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION and gpu.recovery_action is not None:
                entry.valueType = NVML_VALUE_TYPE_UNSIGNED_INT
                entry.value.uiVal = gpu.recovery_action
            else:  # a field this GPU (or this fake) does not have
                entry.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        return values

    # ------------------------------------------------------------ events

    def nvmlEventSetCreate(self) -> FakeEventSet:
        self.calls["nvmlEventSetCreate"] += 1
        self._check_init()
        events = FakeEventSet()
        self.event_sets.append(events)
        return events

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: FakeEventSet) -> None:
        gpu = self._device(handle, "nvmlDeviceRegisterEvents")
        if not gpu.xid_events_supported and eventTypes & nvmlEventTypeXidCriticalError:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        self._registrations.append((handle._index, eventTypes, eventSet))

    def nvmlEventSetWait_v2(self, eventSet: FakeEventSet, timeoutms: int) -> c_nvmlEventData_t:
        self.calls["nvmlEventSetWait_v2"] += 1
        self._check_init()
        if eventSet.freed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        with eventSet.cond:
            if not eventSet.queue and timeoutms > 0:
                eventSet.cond.wait(timeoutms / 1000)
            if not eventSet.queue:
                raise NVMLError(NVML_ERROR_TIMEOUT)
            return eventSet.queue.popleft()

    def nvmlEventSetWait(self, eventSet: FakeEventSet, timeoutms: int) -> c_nvmlEventData_t:
        return self.nvmlEventSetWait_v2(eventSet, timeoutms)

    def nvmlEventSetFree(self, eventSet: FakeEventSet) -> None:
        self.calls["nvmlEventSetFree"] += 1
        self._check_init()
        eventSet.freed = True
        self._registrations = [r for r in self._registrations if r[2] is not eventSet]
