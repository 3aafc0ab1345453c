"""GPU telemetry through NVIDIA's NVML (module `pynvml` from the nvidia-ml-py package).

The NVML module is injected: production passes nothing and gets `import pynvml`, tests pass
tests/fakes/fake_pynvml. Both go through exactly the same code below; only the module object
differs, so nothing here may depend on ctypes details of the real bindings.

Mapping to telemetry/1 `gpus[]` (one entry per NVML device index, always with `index`):

    util, mem_util          nvmlDeviceGetUtilizationRates -> .gpu, .memory (percent)
    mem_used_mib            nvmlDeviceGetMemoryInfo().used (bytes) / 2**20
    temp_c                  nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU)
    power_w                 nvmlDeviceGetPowerUsage (mW) / 1000
    sm_clock_mhz            nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)
    throttle_reasons        nvmlDeviceGetCurrentClocksEventReasons, else ...ClocksThrottleReasons
                            (the older name, for drivers/bindings without the new one)
    ecc_{sbe,dbe}_{volatile,aggregate}
                            nvmlDeviceGetTotalEccErrors(h, CORRECTED|UNCORRECTED, VOLATILE|AGGREGATE)
    retired_pages           len(retired pages, cause MULTIPLE_SINGLE_BIT) + len(cause DOUBLE_BIT);
                            only when both calls answer (a half sum would under-report)
    remapped_rows_pending   nvmlDeviceGetRemappedRows -> (corrRows, uncRows, isPending, failureOccurred);
    remapped_rows_failure   isPending / failureOccurred are C booleans, reported as 1 or 0. The row
                            counts go out as extra keys remapped_rows_correctable/_uncorrectable.
    nvlink_crc_errors       sum over links whose nvmlDeviceGetNvLinkState is NVML_FEATURE_ENABLED of
                            error counters DL_CRC_FLIT + DL_CRC_DATA (both are CRC-detected corruption
                            on the link; data CRC is simply absent on GPUs that do not count it)
    nvlink_replay_errors    the same sum of DL_REPLAY
    nvlink_links_active     (extra) number of active links: a link that goes down drops out of the
                            two sums above, so detectors need this to tell "link lost" from "reset"
    pcie_replay             nvmlDeviceGetPcieReplayCounter
    pcie_link_gen           nvmlDeviceGetCurrPcieLinkGeneration, nvmlDeviceGetCurrPcieLinkWidth: the link
    pcie_link_width         as trained now
    pcie_link_gen_max       nvmlDeviceGetMaxPcieLinkGeneration, nvmlDeviceGetMaxPcieLinkWidth: the most
    pcie_link_width_max     this GPU *in this slot* can train to (see "PCIe link" below)
    recovery_action         nvmlDeviceGetFieldValues([NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]) (field 230), an
                            nvmlDeviceGpuRecoveryAction_t: 0 none, 1 GPU reset, 2 node reboot, 3 drain
                            P2P, 4 drain and reset (nvml.h; later headers add 5 recover IMEX domain, and
                            nvidia-ml-py 13.615 6 bus reset, 7 system reboot). Left out where the field's
                            own nvmlReturn is not SUCCESS (drivers before the field answer NOT_SUPPORTED)
    xids                    XID critical-error events since the last sample (see below)
    lost                    (extra) true when the GPU answers NVML_ERROR_GPU_IS_LOST (XID 79-like)

A call that fails with an NVMLError leaves its field(s) out. NOT_SUPPORTED, FUNCTION_NOT_FOUND
and INVALID_ARGUMENT are permanent for a given device and arguments, so such calls are skipped
on later samples (which also keeps the probe of all NVML_NVLINK_MAX_LINKS links on PCIe GPUs
to one sample) and retried every `reprobe_every` samples in case e.g. MIG or ECC mode changed.
A GPU that is lost keeps being reported with `index`, its cached `uuid`, `lost: true`, whatever
was read before the loss and its XID events (XID 79 arrives exactly then).

PCIe link. Which "max": nvml.h documents nvmlDeviceGetMaxPcieLinkGeneration as "the maximum PCIe
link generation possible with this device and system" (a Gen2 device in a Gen1 bus reports 1) and
nvmlDeviceGetGpuMaxPcieLinkGeneration as the maximum "supported by this device" alone;
nvmlDeviceGetMaxPcieLinkWidth likewise takes the system into account (an x16 device in an x8 slot
reports 8). A link is degraded when it trained below what this GPU in this slot can reach, so the
device-and-system maximum is the one to compare with: against the GPU-only one, every Gen5 GPU in
a Gen4 server would look degraded for good, a fact of the platform and no fault. It is also what
nvidia-smi shows as pcie.link.gen.max ("possible with this GPU and system configuration").
(NVIDIA/go-nvml gen/nvml/nvml.h, NVML 13.3.29, at commit 2f9e261fe40a7a1c54783d66805e8920564763b4;
https://docs.nvidia.com/deploy/nvidia-smi/index.html, the GPU attributes' PCI link entries.)
GPUs lower the link *generation* when idle, to save power, and raise it again under load: NVIDIA
documents the current generation and width as values that "may be reduced when the GPU is not
in use" (nvidia-smi docs above, and `nvidia-smi --help-query-gpu` for pcie.link.gen.current /
pcie.link.width.current), and calls the downgrade "an important integral part of the GPU's power
management" with no user knob (https://forums.developer.nvidia.com/t/prevent-pcie-from-reducing-gen/72537).
So a detector must judge pcie_link_gen against its max only while the GPU is busy (util, power).
Width: the idle downshift people observe is the generation (speed); NVIDIA's sentence covers
width as well, though, so a width below max should persist across samples before it is believed.
Values outside what PCIe defines (generation 1..15, width 0..32) are left out, not sent.

XID events: each GPU gets its *own* event set. NVML reports the source device of an event as a
handle, and mapping that back to an index would need either ctypes pointer comparison (not the
same code for the fake) or nvmlDeviceGetIndex, which fails on the lost GPU whose XID 79 matters
most. With one set per GPU, draining a set tells us the GPU for free.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from fleetwatch import schemas
from fleetwatch.collectors.sources import SingleFlight, SourceUnavailable
from fleetwatch.schemas import MAX_PCIE_GEN, MAX_PCIE_WIDTH

log = logging.getLogger(__name__)

MIB = 2**20
REPROBE_EVERY = 300  # samples (~5 min at 1 Hz) before calls found unsupported are tried again
MAX_EVENTS_PER_DRAIN = 1024  # a bound on the drain loop: never spin forever on a broken event set
MAX_RECOVERY_ACTION = 255  # telemetry/1's bound on recovery_action (NVML defines 0..7 today)
# (telemetry field, NVML call, lowest and highest value PCIe defines)
PCIE_LINK_CALLS = (
    ("pcie_link_gen", "nvmlDeviceGetCurrPcieLinkGeneration", 1, MAX_PCIE_GEN),
    ("pcie_link_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", 1, MAX_PCIE_GEN),
    ("pcie_link_width", "nvmlDeviceGetCurrPcieLinkWidth", 0, MAX_PCIE_WIDTH),
    ("pcie_link_width_max", "nvmlDeviceGetMaxPcieLinkWidth", 0, MAX_PCIE_WIDTH),
)
# nvmlValueType_t constant name -> the nvmlValue_t union member that holds it (pynvml, nvml.h)
VALUE_MEMBERS = (
    ("NVML_VALUE_TYPE_UNSIGNED_INT", "uiVal"),
    ("NVML_VALUE_TYPE_UNSIGNED_LONG", "ulVal"),
    ("NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", "ullVal"),
    ("NVML_VALUE_TYPE_SIGNED_LONG_LONG", "sllVal"),
    ("NVML_VALUE_TYPE_SIGNED_INT", "siVal"),
    ("NVML_VALUE_TYPE_UNSIGNED_SHORT", "usVal"),
    ("NVML_VALUE_TYPE_DOUBLE", "dVal"),
)


class _GpuLost(Exception):
    """Internal: a call answered NVML_ERROR_GPU_IS_LOST; stop querying this GPU for this sample."""


@dataclass
class _Gpu:
    index: int
    handle: Any = None  # None until nvmlDeviceGetHandleByIndex succeeds
    uuid: str | None = None  # cached: it does not change, and it must survive the GPU being lost
    events: Any = None  # this GPU's event set, None when XID events could not be registered
    lost: bool = False
    skip: set[tuple[Any, ...]] = field(default_factory=set)  # (function, *args) known unsupported


def _import_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as e:
        raise SourceUnavailable("nvml: module pynvml (package nvidia-ml-py) is not installed") from e
    return pynvml


class NvmlSource:
    """`sample()` -> {"gpus": [{"index": 0, "uuid": ..., "util": ..., ...}, ...]}.

    Raises SourceUnavailable when NVML cannot be initialised (no library, no driver).
    """

    name = "nvml"

    def __init__(self, nvml: ModuleType | None = None, *, reprobe_every: int = REPROBE_EVERY) -> None:
        self._nv: Any = nvml if nvml is not None else _import_pynvml()
        self._error: type[Exception] = self._nv.NVMLError
        self._permanent = frozenset(
            {
                self._nv.NVML_ERROR_NOT_SUPPORTED,
                self._nv.NVML_ERROR_FUNCTION_NOT_FOUND,
                self._nv.NVML_ERROR_INVALID_ARGUMENT,
            }
        )
        self._guard = SingleFlight(self.name)
        self._reprobe_every = max(1, reprobe_every)
        self._samples = 0
        self._closed = False
        self._noted: set[tuple[int, str, Any]] = set()
        try:
            self._nv.nvmlInit()
        except self._error as e:
            raise SourceUnavailable(f"nvml: nvmlInit failed: {e}") from e
        try:
            count = self._nv.nvmlDeviceGetCount()
        except self._error as e:
            self._shutdown()
            raise SourceUnavailable(f"nvml: nvmlDeviceGetCount failed: {e}") from e
        self._gpus = [_Gpu(index=i) for i in range(count)]
        for gpu in self._gpus:
            self._open(gpu)

    # ------------------------------------------------------------------ public API

    def sample(self) -> dict[str, Any]:
        with self._guard():
            if self._closed:
                raise RuntimeError("nvml: sample() after close()")
            self._samples += 1
            if self._samples % self._reprobe_every == 0:
                for gpu in self._gpus:
                    gpu.skip.clear()
            return {"gpus": [self._sample_gpu(gpu) for gpu in self._gpus]}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for gpu in self._gpus:
            if gpu.events is not None:
                try:
                    self._nv.nvmlEventSetFree(gpu.events)
                except self._error as e:
                    log.debug("nvml: freeing the event set of GPU %d: %s", gpu.index, e)
                gpu.events = None
        self._shutdown()

    # ------------------------------------------------------------------ device setup

    def _open(self, gpu: _Gpu) -> None:
        """Get the handle, UUID and XID event registration; retried each sample until a handle is had."""
        try:
            gpu.handle = self._nv.nvmlDeviceGetHandleByIndex(gpu.index)
        except self._error as e:
            self._note(gpu, "nvmlDeviceGetHandleByIndex", e)
            self._set_lost(gpu, getattr(e, "value", None) == self._nv.NVML_ERROR_GPU_IS_LOST)
            return
        try:
            self._read_uuid(gpu)
        except _GpuLost:
            self._set_lost(gpu, True)
        self._register_xid_events(gpu)

    def _register_xid_events(self, gpu: _Gpu) -> None:
        try:
            events = self._nv.nvmlEventSetCreate()
        except self._error as e:
            self._note(gpu, "nvmlEventSetCreate", e)
            return
        try:
            self._nv.nvmlDeviceRegisterEvents(gpu.handle, self._nv.nvmlEventTypeXidCriticalError, events)
        except self._error as e:
            # NOT_SUPPORTED on some GPUs (and in some VMs): then this GPU simply has no `xids` key.
            self._note(gpu, "nvmlDeviceRegisterEvents", e)
            with contextlib.suppress(self._error):
                self._nv.nvmlEventSetFree(events)
            return
        gpu.events = events

    def _shutdown(self) -> None:
        try:
            self._nv.nvmlShutdown()
        except self._error as e:
            log.debug("nvml: nvmlShutdown: %s", e)

    # ------------------------------------------------------------------ one sample

    def _sample_gpu(self, gpu: _Gpu) -> dict[str, Any]:
        if gpu.handle is None:
            self._open(gpu)
        out: dict[str, Any] = {"index": gpu.index}
        if gpu.uuid is not None:
            out["uuid"] = gpu.uuid
        if gpu.handle is not None:
            try:
                self._read_fields(gpu, out)
                self._set_lost(gpu, False)
            except _GpuLost:
                self._set_lost(gpu, True)
        if gpu.uuid is not None:  # also when it was only read just now
            out["uuid"] = gpu.uuid
        if gpu.lost:
            out["lost"] = True
        xids = self._drain_xids(gpu)
        if xids is not None:
            out["xids"] = xids
        self._keep_within_contract(gpu, out)
        return out

    def _keep_within_contract(self, gpu: _Gpu, out: dict[str, Any]) -> None:
        """Leave out what NVML answered past what the contract allows (a "not available" of a wider
        type than its field, a sum past 64 bits, an XID past 32 bits): one such value made the
        agent leave the whole GPU source's part out of the sample, every GPU's. Logged once."""
        xids = out.get("xids")
        if xids:
            kept = [x for x in xids if 0 <= x <= schemas.MAX_XID][: schemas.MAX_XIDS]
            if len(kept) != len(xids):
                self._note_value(gpu, "nvmlEventSetWait_v2", [x for x in xids if x not in kept][:8])
            out["xids"] = kept
        for key in schemas.outside(f"gpus[{gpu.index}]", out, schemas.GPU_FIELDS):
            self._note_value(gpu, key, out.pop(key))

    def _read_fields(self, gpu: _Gpu, out: dict[str, Any]) -> None:
        nv = self._nv
        if gpu.uuid is None:
            self._read_uuid(gpu)
        util = self._call(gpu, "nvmlDeviceGetUtilizationRates")
        if util is not None:
            out["util"] = int(util.gpu)
            out["mem_util"] = int(util.memory)
        mem = self._call(gpu, "nvmlDeviceGetMemoryInfo")
        if mem is not None:
            out["mem_used_mib"] = mem.used / MIB
        _put(out, "temp_c", self._call(gpu, "nvmlDeviceGetTemperature", nv.NVML_TEMPERATURE_GPU))
        power_mw = self._call(gpu, "nvmlDeviceGetPowerUsage")
        if power_mw is not None:
            out["power_w"] = power_mw / 1000
        _put(out, "sm_clock_mhz", self._call(gpu, "nvmlDeviceGetClockInfo", nv.NVML_CLOCK_SM))
        _put(out, "throttle_reasons", self._throttle_reasons(gpu))
        self._read_ecc(gpu, out)
        self._read_retired_pages(gpu, out)
        self._read_remapped_rows(gpu, out)
        self._read_nvlink(gpu, out)
        _put(out, "pcie_replay", self._call(gpu, "nvmlDeviceGetPcieReplayCounter"))
        for key, function, lo, hi in PCIE_LINK_CALLS:
            self._put_bounded(gpu, out, key, function, self._call(gpu, function), lo, hi)
        self._read_recovery_action(gpu, out)

    def _read_uuid(self, gpu: _Gpu) -> None:
        uuid = self._call(gpu, "nvmlDeviceGetUUID")
        if isinstance(uuid, bytes):  # bindings older than the str/bytes conversion return bytes
            uuid = uuid.decode(errors="replace")
        if uuid:
            gpu.uuid = str(uuid)

    def _throttle_reasons(self, gpu: _Gpu) -> int | None:
        # "Throttle" was renamed "clocks event" in NVML 12.2; the old call stays as the fallback.
        value = self._call(gpu, "nvmlDeviceGetCurrentClocksEventReasons")
        if value is None:
            value = self._call(gpu, "nvmlDeviceGetCurrentClocksThrottleReasons")
        return value

    def _read_ecc(self, gpu: _Gpu, out: dict[str, Any]) -> None:
        nv = self._nv
        for key, error_type, counter_type in (
            ("ecc_sbe_volatile", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC),
            ("ecc_dbe_volatile", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC),
            ("ecc_sbe_aggregate", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_AGGREGATE_ECC),
            ("ecc_dbe_aggregate", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_AGGREGATE_ECC),
        ):
            _put(out, key, self._call(gpu, "nvmlDeviceGetTotalEccErrors", error_type, counter_type))

    def _read_retired_pages(self, gpu: _Gpu, out: dict[str, Any]) -> None:
        nv = self._nv
        sbe = self._call(
            gpu, "nvmlDeviceGetRetiredPages", nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        )
        dbe = self._call(gpu, "nvmlDeviceGetRetiredPages", nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        if sbe is not None and dbe is not None:
            out["retired_pages"] = len(sbe) + len(dbe)

    def _read_remapped_rows(self, gpu: _Gpu, out: dict[str, Any]) -> None:
        rows = self._call(gpu, "nvmlDeviceGetRemappedRows")
        if rows is None:
            return
        correctable, uncorrectable, pending, failure = rows
        out["remapped_rows_pending"] = 1 if pending else 0
        out["remapped_rows_failure"] = 1 if failure else 0
        out["remapped_rows_correctable"] = int(correctable)
        out["remapped_rows_uncorrectable"] = int(uncorrectable)

    def _read_nvlink(self, gpu: _Gpu, out: dict[str, Any]) -> None:
        nv = self._nv
        active = 0
        present = False
        crc: int | None = None
        replay: int | None = None
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            state = self._call(gpu, "nvmlDeviceGetNvLinkState", link)
            if state is None:  # no such link (cached as unsupported after the first sample)
                continue
            present = True
            if state != nv.NVML_FEATURE_ENABLED:
                continue
            active += 1
            for counter in (nv.NVML_NVLINK_ERROR_DL_CRC_FLIT, nv.NVML_NVLINK_ERROR_DL_CRC_DATA):
                crc = _add(crc, self._call(gpu, "nvmlDeviceGetNvLinkErrorCounter", link, counter))
            replay = _add(
                replay,
                self._call(gpu, "nvmlDeviceGetNvLinkErrorCounter", link, nv.NVML_NVLINK_ERROR_DL_REPLAY),
            )
        if present:
            out["nvlink_links_active"] = active
        _put(out, "nvlink_crc_errors", crc)
        _put(out, "nvlink_replay_errors", replay)

    def _read_recovery_action(self, gpu: _Gpu, out: dict[str, Any]) -> None:
        nv = self._nv
        field_id = getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        key = ("field", field_id)
        if field_id is None or key in gpu.skip:  # bindings before the field, or known unsupported
            return
        values = self._call(gpu, "nvmlDeviceGetFieldValues", (field_id,))
        if values is None:
            return
        try:
            entry = values[0]
            code = entry.nvmlReturn
        except (IndexError, AttributeError, TypeError):
            self._note_value(gpu, "nvmlDeviceGetFieldValues", values)
            return
        if code != nv.NVML_SUCCESS:
            # The field's own status: NOT_SUPPORTED where the driver predates the field (the call as
            # a whole still succeeds). Permanent ones are skipped until the next reprobe.
            if code == nv.NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost
            if code in self._permanent:
                gpu.skip.add(key)
            self._note(gpu, f"nvmlDeviceGetFieldValues({field_id})", self._error(code))
            return
        value = self._field_value(entry)
        if value is None or not 0 <= value <= MAX_RECOVERY_ACTION:
            self._note_value(gpu, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", value)
            return
        out["recovery_action"] = value

    def _field_value(self, entry: Any) -> int | None:
        """A field value's integer, read from the union member its valueType names; None for a type
        this does not know or a double that is no integer."""
        value_type = getattr(entry, "valueType", None)
        for constant, member in VALUE_MEMBERS:
            if value_type == getattr(self._nv, constant, None):
                value = getattr(entry.value, member)
                if isinstance(value, float):
                    return int(value) if value.is_integer() else None
                return int(value)
        return None

    def _drain_xids(self, gpu: _Gpu) -> list[int] | None:
        """XIDs queued on this GPU's event set since the last drain; None when not registered."""
        if gpu.events is None:
            return None
        nv = self._nv
        xids: list[int] = []
        for _ in range(MAX_EVENTS_PER_DRAIN):
            try:
                event = nv.nvmlEventSetWait_v2(gpu.events, 0)  # 0 ms: take what is queued, never wait
            except self._error as e:
                if getattr(e, "value", None) != nv.NVML_ERROR_TIMEOUT:  # TIMEOUT just means "queue empty"
                    self._note(gpu, "nvmlEventSetWait_v2", e)
                break
            if event.eventType & nv.nvmlEventTypeXidCriticalError:
                xids.append(int(event.eventData))
        return xids

    # ------------------------------------------------------------------ helpers

    def _call(self, gpu: _Gpu, function: str, *args: Any) -> Any:
        """nvml.<function>(handle, *args), or None when NVML cannot answer; raises _GpuLost."""
        key = (function, *args)
        if key in gpu.skip:
            return None
        fn = getattr(self._nv, function, None)
        if fn is None:  # bindings too old to have this call
            gpu.skip.add(key)
            return None
        try:
            return fn(gpu.handle, *args)
        except self._error as e:
            code = getattr(e, "value", None)
            if code == self._nv.NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost from None
            if code in self._permanent:
                gpu.skip.add(key)
            self._note(gpu, function, e)
            return None

    def _put_bounded(
        self, gpu: _Gpu, out: dict[str, Any], key: str, function: str, value: Any, lo: int, hi: int
    ) -> None:
        """out[key] = value where it is an integer in [lo, hi]; a value past what the contract allows
        would make the whole sample invalid, so it is logged (once) and left out."""
        if value is None:
            return
        if isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi:
            out[key] = int(value)
        else:
            self._note_value(gpu, function, value)

    def _note_value(self, gpu: _Gpu, function: str, value: Any) -> None:
        key = (gpu.index, function, "value")
        if key not in self._noted:
            self._noted.add(key)
            log.warning(
                "nvml: GPU %d: %s answered %r, beyond what it can mean: left out", gpu.index, function, value
            )

    def _set_lost(self, gpu: _Gpu, lost: bool) -> None:
        if lost and not gpu.lost:
            log.warning(
                "nvml: GPU %d (%s) is lost (fell off the bus?)", gpu.index, gpu.uuid or "uuid unknown"
            )
        elif gpu.lost and not lost:
            log.warning("nvml: GPU %d answers again", gpu.index)
        gpu.lost = lost

    def _note(self, gpu: _Gpu, function: str, error: Exception) -> None:
        """Log each (GPU, call, error code) once: unsupported calls are normal and would flood the log."""
        key = (gpu.index, function, getattr(error, "value", None))
        if key not in self._noted:
            self._noted.add(key)
            log.debug("nvml: GPU %d: %s: %s", gpu.index, function, error)


def _put(out: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        out[key] = int(value)


def _add(total: int | None, value: Any) -> int | None:
    """Sum that stays None until some counter actually answered; NOT_AVAILABLE_U64 once any link's
    counter is "not available" (NVML_VALUE_NOT_AVAILABLE_ulonglong): the sum without that link
    would drop by its count and jump back by all of it when it answers again, a burst of errors
    that never happened. The schema's not-available value, which the detectors read as absent."""
    if value is None:
        return total
    if total == NOT_AVAILABLE_U64 or int(value) >= NOT_AVAILABLE_U64:
        return NOT_AVAILABLE_U64
    return int(value) if total is None else total + int(value)


NOT_AVAILABLE_U64 = (1 << 64) - 1
