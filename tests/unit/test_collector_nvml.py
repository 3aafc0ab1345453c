"""NvmlSource against the fake NVML (and, where one exists, the real one), plus the Source factory."""

from __future__ import annotations

import ctypes
import inspect
import threading
import time

import pynvml
import pytest

from fleetwatch import schemas
from fleetwatch.collectors.host import HostSource
from fleetwatch.collectors.net import NetSource
from fleetwatch.collectors.nvml import NvmlSource
from fleetwatch.collectors.sources import Source, SourceBusy, SourceUnavailable, make_source
from fleetwatch.detectors.kernel_events import RECOVERY_ACTIONS
from tests.fakes import FakeGpu, FakeLink, FakeNvml, fake_pynvml, telemetry_message, write_tree

# ---------------------------------------------------------------- the fake follows the real bindings


def test_fake_constants_and_error_classes_match_real_pynvml() -> None:
    fake = FakeNvml([FakeGpu()]).module
    names = [n for n in dir(fake) if n.startswith(("NVML_", "nvmlEventType"))]
    assert len(names) > 40
    for name in names:
        assert getattr(pynvml, name) == getattr(fake, name), name
    error_classes = [n for n in dir(fake) if n.startswith("NVMLError_")]
    assert {"NVMLError_NotSupported", "NVMLError_Timeout", "NVMLError_GpuIsLost"} <= set(error_classes)
    for name in error_classes:
        real_cls, fake_cls = getattr(pynvml, name), getattr(fake, name)
        # Same code, and NVMLError(code) picks the same subclass in both.
        assert real_cls().value == fake_cls().value, name
        assert (
            type(pynvml.NVMLError(real_cls().value)).__name__
            == type(fake.NVMLError(fake_cls().value)).__name__
        )
    assert isinstance(fake.NVMLError(15), fake.NVMLError_GpuIsLost)
    assert isinstance(fake.NVMLError_Timeout(), fake.NVMLError)


def test_fake_api_has_the_real_names_and_parameters() -> None:
    for name in FakeNvml.API:
        real = inspect.signature(getattr(pynvml, name))
        fake = inspect.signature(getattr(FakeNvml([]).module, name))
        assert list(real.parameters) == list(fake.parameters), name


def test_fake_gpus_are_independent_copies() -> None:
    fake = FakeNvml([FakeGpu(temp_c=50)] * 3)
    fake.gpus[1].temp_c = 90
    assert [g.temp_c for g in fake.gpus] == [50, 90, 50]
    assert len({g.uuid for g in fake.gpus}) == 3


# ---------------------------------------------------------------- values


def test_every_field_mapped_and_converted() -> None:
    gpu = FakeGpu(
        uuid="GPU-1234",
        util=87,
        mem_util=45,
        mem_used_bytes=3 * 2**30 + 2**19,
        temp_c=71,
        power_mw=412_345,
        sm_clock_mhz=1755,
        clocks_event_reasons=0x4 | 0x20,
        ecc_sbe_volatile=11,
        ecc_dbe_volatile=1,
        ecc_sbe_aggregate=120,
        ecc_dbe_aggregate=3,
        retired_pages_sbe=[0x1000, 0x2000],
        retired_pages_dbe=[0x3000],
        remapped_rows=(5, 2, 1, 0),
        nvlinks=[
            FakeLink(crc_flit=1, crc_data=2, replay=4),
            FakeLink(active=False, crc_flit=100, crc_data=100, replay=100),  # down: not summed
            FakeLink(crc_flit=10, crc_data=20, replay=40),
        ],
        pcie_replay=7,
        # an A100 (Gen4 x16) whose link trained at x8, and whose driver asks for a GPU reset
        pcie_link_gen=4,
        pcie_link_gen_max=4,
        pcie_link_gen_gpu_max=4,
        pcie_link_width=8,
        pcie_link_width_max=16,
        recovery_action=fake_pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET,
    )
    src = NvmlSource(nvml=FakeNvml([gpu]).module)
    assert src.sample() == {
        "gpus": [
            {
                "index": 0,
                "uuid": "GPU-1234",
                "util": 87,
                "mem_util": 45,
                "mem_used_mib": 3072.5,
                "temp_c": 71,
                "power_w": 412.345,
                "sm_clock_mhz": 1755,
                "throttle_reasons": 0x24,
                "ecc_sbe_volatile": 11,
                "ecc_dbe_volatile": 1,
                "ecc_sbe_aggregate": 120,
                "ecc_dbe_aggregate": 3,
                "retired_pages": 3,
                "remapped_rows_pending": 1,
                "remapped_rows_failure": 0,
                "remapped_rows_correctable": 5,
                "remapped_rows_uncorrectable": 2,
                "nvlink_links_active": 2,
                "nvlink_crc_errors": 33,
                "nvlink_replay_errors": 44,
                "pcie_replay": 7,
                "pcie_link_gen": 4,
                "pcie_link_gen_max": 4,
                "pcie_link_width": 8,
                "pcie_link_width_max": 16,
                "recovery_action": 1,
                "xids": [],
            }
        ]
    }
    src.close()


def test_remap_failure_and_values_follow_the_device() -> None:
    fake = FakeNvml([FakeGpu(remapped_rows=(0, 8, 0, 1), temp_c=40)])
    src = NvmlSource(nvml=fake.module)
    first = src.sample()["gpus"][0]
    assert (first["remapped_rows_pending"], first["remapped_rows_failure"], first["temp_c"]) == (0, 1, 40)
    fake.gpus[0].temp_c = 93
    fake.gpus[0].nvlinks = []
    assert src.sample()["gpus"][0]["temp_c"] == 93


# ---------------------------------------------------------------- unsupported and failing calls


def test_unsupported_fields_are_absent_not_invented() -> None:
    gpu = FakeGpu(
        util=None,
        power_mw=None,
        ecc_sbe_volatile=None,
        ecc_dbe_volatile=None,
        ecc_sbe_aggregate=None,
        ecc_dbe_aggregate=None,
        retired_pages_sbe=None,
        retired_pages_dbe=None,
        remapped_rows=None,
        pcie_replay=None,
        pcie_link_gen=None,
        pcie_link_gen_max=None,
        pcie_link_width=None,
        pcie_link_width_max=None,
        recovery_action=None,
        xid_events_supported=False,
    )  # and nvlinks=[]: a PCIe card without NVLink
    src = NvmlSource(nvml=FakeNvml([gpu]).module)
    out = src.sample()["gpus"][0]
    assert set(out) == {"index", "uuid", "mem_used_mib", "temp_c", "sm_clock_mhz", "throttle_reasons"}


def test_half_supported_retired_pages_is_not_reported_as_a_total() -> None:
    src = NvmlSource(nvml=FakeNvml([FakeGpu(retired_pages_sbe=[1, 2], retired_pages_dbe=None)]).module)
    assert "retired_pages" not in src.sample()["gpus"][0]


def test_unsupported_calls_are_skipped_then_reprobed() -> None:
    fake = FakeNvml([FakeGpu(power_mw=None)])  # no NVLink either: 36 link probes the first time
    src = NvmlSource(nvml=fake.module, reprobe_every=3)
    src.sample()
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1
    assert fake.calls["nvmlDeviceGetNvLinkState"] == fake_pynvml.NVML_NVLINK_MAX_LINKS
    src.sample()
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1  # known unsupported: not asked again
    assert fake.calls["nvmlDeviceGetNvLinkState"] == fake_pynvml.NVML_NVLINK_MAX_LINKS
    fake.gpus[0].power_mw = 250_000  # e.g. a mode change; the third sample probes again
    assert src.sample()["gpus"][0]["power_w"] == 250.0


def test_transient_errors_omit_the_field_and_are_retried() -> None:
    errors = {
        "nvmlDeviceGetTemperature": fake_pynvml.NVML_ERROR_NO_PERMISSION,
        "nvmlDeviceGetPowerUsage": fake_pynvml.NVML_ERROR_UNKNOWN,
    }
    fake = FakeNvml([FakeGpu(temp_c=66, power_mw=300_000, errors=errors)])
    src = NvmlSource(nvml=fake.module)
    out = src.sample()["gpus"][0]
    assert "temp_c" not in out and "power_w" not in out and out["util"] == 0
    fake.gpus[0].errors.clear()
    out = src.sample()["gpus"][0]
    assert (out["temp_c"], out["power_w"]) == (66, 300.0)


def test_throttle_reasons_fall_back_to_the_old_call() -> None:
    not_supported = {"nvmlDeviceGetCurrentClocksEventReasons": fake_pynvml.NVML_ERROR_NOT_SUPPORTED}
    src = NvmlSource(nvml=FakeNvml([FakeGpu(clocks_event_reasons=0x8, errors=not_supported)]).module)
    assert src.sample()["gpus"][0]["throttle_reasons"] == 0x8
    old_bindings = FakeNvml(
        [FakeGpu(clocks_event_reasons=0x40)], without=["nvmlDeviceGetCurrentClocksEventReasons"]
    )
    assert not hasattr(old_bindings.module, "nvmlDeviceGetCurrentClocksEventReasons")
    assert NvmlSource(nvml=old_bindings.module).sample()["gpus"][0]["throttle_reasons"] == 0x40
    assert old_bindings.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 1


def test_nvlink_sums_only_supported_counters_of_active_links() -> None:
    links = [FakeLink(crc_flit=3, crc_data=None, replay=1), FakeLink(crc_flit=4, crc_data=None, replay=None)]
    fake = FakeNvml([FakeGpu(nvlinks=links)])
    src = NvmlSource(nvml=fake.module)
    out = src.sample()["gpus"][0]
    assert (out["nvlink_crc_errors"], out["nvlink_replay_errors"], out["nvlink_links_active"]) == (7, 1, 2)
    for link in fake.gpus[0].nvlinks:
        link.active = False
    out = src.sample()["gpus"][0]
    # Links exist but none is up: say so, and report no error sums over zero links.
    assert out["nvlink_links_active"] == 0
    assert "nvlink_crc_errors" not in out and "nvlink_replay_errors" not in out


# ---------------------------------------------------------------- PCIe link, recovery action


def test_fake_field_value_structs_are_laid_out_as_pynvmls() -> None:
    for name in ("c_nvmlFieldValue_t", "c_nvmlValue_t"):
        real, fake = getattr(pynvml, name), getattr(fake_pynvml, name)
        assert [n for n, _ in real._fields_] == [n for n, _ in fake._fields_], name
        assert [ctypes.sizeof(t) for _, t in real._fields_] == [ctypes.sizeof(t) for _, t in fake._fields_]
        assert ctypes.sizeof(real) == ctypes.sizeof(fake), name
    # the values this source sends and detectors.kernel_events names, as nvml.h and pynvml define them
    assert pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION == 230
    assert [
        pynvml.NVML_GPU_RECOVERY_ACTION_NONE,
        pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET,
        pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT,
        pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_P2P,
        pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET,
    ] == [0, 1, 2, 3, 4]
    # and every value this pynvml names (5-7 came with NVML 610-615) is one the detectors judge
    named = {v for k, v in vars(pynvml).items() if k.startswith("NVML_GPU_RECOVERY_ACTION_")}
    assert named <= set(RECOVERY_ACTIONS) and set(range(5)) <= set(RECOVERY_ACTIONS)


def test_pcie_max_is_what_gpu_and_slot_allow_not_the_gpu_alone() -> None:
    # an H100 (Gen5) in a Gen4 server: trained Gen4 x16, as far as the slot allows: not degraded
    fake = FakeNvml([FakeGpu(pcie_link_gen=4, pcie_link_gen_max=4, pcie_link_gen_gpu_max=5)])
    src = NvmlSource(nvml=fake.module)
    out = src.sample()["gpus"][0]
    assert (out["pcie_link_gen"], out["pcie_link_gen_max"]) == (4, 4)
    assert (out["pcie_link_width"], out["pcie_link_width_max"]) == (16, 16)
    assert fake.calls["nvmlDeviceGetGpuMaxPcieLinkGeneration"] == 0
    # idle, the GPU drops its link to Gen1 (power saving); under load it is back at Gen4: the
    # source reports what NVML says each time, the detectors judge it against the load
    fake.gpus[0].pcie_link_gen = 1
    assert src.sample()["gpus"][0]["pcie_link_gen"] == 1
    fake.gpus[0].pcie_link_gen = 4
    assert src.sample()["gpus"][0]["pcie_link_gen"] == 4


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("pcie_link_gen", 0),  # no generation 0: unknown, left out
        ("pcie_link_gen", 16),  # past the 4-bit speed field
        ("pcie_link_gen_max", 2**32 - 1),  # an unsigned int's -1
        ("pcie_link_width", 33),
        ("pcie_link_width_max", 63),  # a link status register read as all ones
        ("recovery_action", 256),
        ("recovery_action", 2**32 - 1),
    ],
)
def test_values_nothing_defines_are_left_out_not_sent(field: str, value: int) -> None:
    fake = FakeNvml([FakeGpu(**{field: value})])
    body = NvmlSource(nvml=fake.module).sample()
    out = body["gpus"][0]
    assert field not in out
    assert field == "pcie_link_width" or out["pcie_link_width"] == 16  # the rest is still read
    assert schemas.validate(telemetry_message(body))


@pytest.mark.parametrize(
    ("gpu", "left_out"),
    [
        (FakeGpu(util=2**32 - 1), "util"),  # an unsigned int's "not available"
        (FakeGpu(temp_c=2**32 - 1), "temp_c"),
        (
            FakeGpu(nvlinks=[FakeLink(crc_flit=2**60, crc_data=2**60)] * 18),
            "nvlink_crc_errors",
        ),  # past 64 bits
    ],
)
def test_any_gpu_field_past_the_contract_is_left_out_alone(gpu: FakeGpu, left_out: str) -> None:
    """An adversarial probe's finds: each made the agent leave the whole GPU source's part out (every
    GPU's fields), every second it lasted."""
    body = NvmlSource(nvml=FakeNvml([FakeGpu(), gpu]).module).sample()
    schemas.validate(telemetry_message(body))
    assert left_out not in body["gpus"][1] and body["gpus"][1]["sm_clock_mhz"] == 1980
    assert body["gpus"][0]["util"] == 0 and body["gpus"][0]["temp_c"] == 40  # the other GPU as read


def test_a_links_not_available_counter_makes_the_nvlink_sum_not_available() -> None:
    """NVML_VALUE_NOT_AVAILABLE_ulonglong on a link's CRC counters: summed, they went past 64 bits
    and the GPU source's part was out of contract; left out of the sum, the sum would drop by that
    link's count and jump back when it answers (a burst that never happened). The sum is the
    schema's not-available value, which the detectors read as absent."""
    u64 = 2**64 - 1
    links = [FakeLink(crc_flit=u64, crc_data=u64), FakeLink(crc_flit=3, crc_data=4)]
    body = NvmlSource(nvml=FakeNvml([FakeGpu(nvlinks=links)]).module).sample()
    schemas.validate(telemetry_message(body))
    out = body["gpus"][0]
    assert out["nvlink_crc_errors"] == u64 and out["nvlink_links_active"] == 2


def test_an_xid_past_32_bits_is_left_out_and_the_others_kept() -> None:
    fake = FakeNvml([FakeGpu()])
    src = NvmlSource(nvml=fake.module)
    fake.inject_xid(0, 79, 2**40, 48)
    body = src.sample()
    schemas.validate(telemetry_message(body))
    assert body["gpus"][0]["xids"] == [79, 48]


def test_recovery_action_every_value_and_beyond() -> None:
    fake = FakeNvml([FakeGpu(recovery_action=a) for a in (0, 1, 2, 3, 4, 7)])
    gpus = NvmlSource(nvml=fake.module).sample()["gpus"]
    # 7: NVML_GPU_RECOVERY_ACTION_SYSTEM_REBOOT of newer bindings, sent as NVML says it
    assert [g["recovery_action"] for g in gpus] == [0, 1, 2, 3, 4, 7]
    assert fake.calls["nvmlDeviceGetFieldValues"] == 6


def test_recovery_action_unsupported_field_is_absent_and_skipped_until_reprobe() -> None:
    fake = FakeNvml([FakeGpu(recovery_action=None)])  # a driver before the field: NOT_SUPPORTED
    src = NvmlSource(nvml=fake.module, reprobe_every=4)
    for _ in range(3):
        assert "recovery_action" not in src.sample()["gpus"][0]
    assert fake.calls["nvmlDeviceGetFieldValues"] == 1
    fake.gpus[0].recovery_action = 2  # e.g. a driver upgrade: the reprobe finds the field
    assert src.sample()["gpus"][0]["recovery_action"] == 2


def test_recovery_action_transient_field_error_is_retried() -> None:
    errors = {fake_pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: fake_pynvml.NVML_ERROR_UNKNOWN}
    fake = FakeNvml([FakeGpu(recovery_action=1, field_errors=errors)])
    src = NvmlSource(nvml=fake.module)
    assert "recovery_action" not in src.sample()["gpus"][0]
    fake.gpus[0].field_errors.clear()
    assert src.sample()["gpus"][0]["recovery_action"] == 1
    assert fake.calls["nvmlDeviceGetFieldValues"] == 2


def test_recovery_action_without_the_call_or_the_constant() -> None:
    # the call as a whole unsupported, bindings without nvmlDeviceGetFieldValues, bindings without the field
    whole = FakeNvml([FakeGpu(errors={"nvmlDeviceGetFieldValues": fake_pynvml.NVML_ERROR_NOT_SUPPORTED})])
    old_call = FakeNvml([FakeGpu()], without=["nvmlDeviceGetFieldValues"])
    old_field = FakeNvml([FakeGpu()])
    del old_field.module.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    for fake in (whole, old_call, old_field):
        src = NvmlSource(nvml=fake.module)
        for _ in range(2):
            out = src.sample()["gpus"][0]
            assert "recovery_action" not in out and out["temp_c"] == 40
    assert whole.calls["nvmlDeviceGetFieldValues"] == 1 and old_field.calls["nvmlDeviceGetFieldValues"] == 0


@pytest.mark.parametrize(
    ("value_type", "value", "expected"),
    [
        (fake_pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, 4, 4),
        (fake_pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 2, 2),
        (fake_pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT, 3, 3),
        (fake_pynvml.NVML_VALUE_TYPE_SIGNED_INT, 1, 1),
        (fake_pynvml.NVML_VALUE_TYPE_DOUBLE, 2.0, 2),
        (fake_pynvml.NVML_VALUE_TYPE_DOUBLE, 2.5, None),  # no action is a half
        (fake_pynvml.NVML_VALUE_TYPE_SIGNED_INT, -1, None),
        (fake_pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, 2**40, None),
        (99, 1, None),  # a value type these bindings do not know
    ],
)
def test_recovery_action_read_from_the_member_its_type_names(
    value_type: int, value: float, expected: int | None
) -> None:
    field_id = fake_pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    fake = FakeNvml([FakeGpu(field_values={field_id: (value_type, value)})])
    out = NvmlSource(nvml=fake.module).sample()["gpus"][0]
    assert out.get("recovery_action") == expected


def test_recovery_action_field_answering_gpu_lost_marks_the_gpu_lost() -> None:
    errors = {fake_pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: fake_pynvml.NVML_ERROR_GPU_IS_LOST}
    out = NvmlSource(nvml=FakeNvml([FakeGpu(field_errors=errors)]).module).sample()["gpus"][0]
    assert out["lost"] is True and out["pcie_link_gen"] == 5  # what was read before stays


# ---------------------------------------------------------------- XID events


def test_xids_drained_into_the_right_gpu_and_not_repeated() -> None:
    fake = FakeNvml([FakeGpu()] * 4)
    src = NvmlSource(nvml=fake.module)
    fake.inject_xid(2, 48, 63)
    fake.inject_xid(0, 13)
    assert [g["xids"] for g in src.sample()["gpus"]] == [[13], [], [48, 63], []]
    assert [g["xids"] for g in src.sample()["gpus"]] == [[], [], [], []]
    fake.inject_xid(3, 94)
    assert [g["xids"] for g in src.sample()["gpus"]] == [[], [], [], [94]]


def test_xids_absent_where_event_registration_is_not_supported() -> None:
    fake = FakeNvml([FakeGpu(), FakeGpu(xid_events_supported=False)])
    src = NvmlSource(nvml=fake.module)
    fake.inject_xid(1, 31)  # nobody listens on GPU 1, as with the real library
    gpus = src.sample()["gpus"]
    assert gpus[0]["xids"] == [] and "xids" not in gpus[1]
    assert gpus[1]["temp_c"] == 40  # the GPU itself is still reported


# ---------------------------------------------------------------- lost GPUs


def test_lost_gpu_is_still_reported_with_its_xid_79() -> None:
    fake = FakeNvml([FakeGpu(), FakeGpu()])
    src = NvmlSource(nvml=fake.module)
    uuid1 = src.sample()["gpus"][1]["uuid"]
    fake.lose(1)
    gpus = src.sample()["gpus"]
    assert gpus[1] == {"index": 1, "uuid": uuid1, "lost": True, "xids": [79]}
    assert gpus[0]["temp_c"] == 40 and "lost" not in gpus[0]
    assert src.sample()["gpus"][1] == {"index": 1, "uuid": uuid1, "lost": True, "xids": []}


def test_lost_gpu_costs_one_call_per_sample() -> None:
    fake = FakeNvml([FakeGpu(nvlinks=[FakeLink()] * 18)])
    src = NvmlSource(nvml=fake.module)
    fake.lose(0)
    src.sample()
    before = fake.calls.copy()
    src.sample()
    # The first query answers GPU_IS_LOST and the rest of the GPU is skipped; the drain still runs.
    assert fake.calls - before == {"nvmlDeviceGetUtilizationRates": 1, "nvmlEventSetWait_v2": 1}


def test_gpu_lost_mid_sample_keeps_what_was_read() -> None:
    lost_late = {"nvmlDeviceGetPcieReplayCounter": fake_pynvml.NVML_ERROR_GPU_IS_LOST}
    src = NvmlSource(nvml=FakeNvml([FakeGpu(temp_c=88, errors=lost_late)]).module)
    out = src.sample()["gpus"][0]
    assert out["lost"] is True and out["temp_c"] == 88 and "pcie_replay" not in out


def test_gpu_lost_before_start_is_reported_and_recovers() -> None:
    fake = FakeNvml([FakeGpu(), FakeGpu(lost=True)])
    src = NvmlSource(nvml=fake.module)
    assert src.sample()["gpus"][1] == {"index": 1, "lost": True}
    fake.gpus[1].lost = False
    out = src.sample()["gpus"][1]
    assert "lost" not in out and out["uuid"] == fake.gpus[1].uuid and out["xids"] == []


# ---------------------------------------------------------------- lifecycle, hangs


def test_init_once_handles_cached_close_releases() -> None:
    fake = FakeNvml([FakeGpu()] * 8)
    src = NvmlSource(nvml=fake.module)
    for _ in range(3):
        assert len(src.sample()["gpus"]) == 8
    assert fake.calls["nvmlInit"] == 1
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == 8
    assert fake.calls["nvmlDeviceGetUUID"] == 8
    assert fake.init_count == 1
    src.close()
    src.close()  # twice is harmless
    assert fake.init_count == 0 and all(s.freed for s in fake.event_sets) and len(fake.event_sets) == 8
    with pytest.raises(RuntimeError):
        src.sample()


def test_nvml_init_failure_is_source_unavailable() -> None:
    fake = FakeNvml([FakeGpu()], init_error=fake_pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(SourceUnavailable, match="Driver Not Loaded"):
        NvmlSource(nvml=fake.module)


def test_hang_in_the_fake_really_blocks_and_a_second_sample_fails_fast() -> None:
    fake = FakeNvml([FakeGpu(temp_c=55, hangs={"nvmlDeviceGetTemperature"})], hang_timeout_s=10)
    src = NvmlSource(nvml=fake.module)
    result: dict[str, object] = {}
    worker = threading.Thread(target=lambda: result.update(src.sample()), daemon=True)
    worker.start()
    assert fake.hanging.wait(5)
    worker.join(0.3)
    assert worker.is_alive() and not result  # still stuck inside nvmlDeviceGetTemperature
    t0 = time.monotonic()
    with pytest.raises(SourceBusy):
        src.sample()
    assert time.monotonic() - t0 < 0.5
    fake.release()
    worker.join(5)
    assert not worker.is_alive()
    assert result["gpus"][0]["temp_c"] == 55  # type: ignore[index]


# ---------------------------------------------------------------- real NVML, factory, merged message


def test_real_pynvml_goes_through_the_same_code() -> None:
    """With the real bindings: unavailable here (no NVIDIA driver), a valid body on a GPU machine."""
    try:
        src = NvmlSource()
    except SourceUnavailable as e:
        assert "nvmlInit failed" in str(e)
        assert isinstance(e.__cause__, pynvml.NVMLError)
        return
    try:
        body = src.sample()
        schemas.validate(telemetry_message(body))
        assert [g["index"] for g in body["gpus"]] == list(range(len(body["gpus"])))
        assert all("uuid" in g for g in body["gpus"])
    finally:
        src.close()


def test_make_source_builds_each_source_and_rejects_unknown_names(tmp_path) -> None:
    fake = FakeNvml([FakeGpu()])
    sources = [
        make_source("nvml", nvml=fake.module),
        make_source("host", proc_root=str(tmp_path)),
        make_source("net", sys_root=str(tmp_path), proc_root=str(tmp_path)),
    ]
    assert [s.name for s in sources] == ["nvml", "host", "net"]
    assert all(isinstance(s, Source) for s in sources)
    assert list(sources[1].sample()) == ["host"]
    with pytest.raises(ValueError, match="unknown source 'no-such-source'"):
        make_source("no-such-source")


def test_merged_output_of_all_three_sources_validates(tmp_path) -> None:
    fake = FakeNvml(
        [FakeGpu(util=90, nvlinks=[FakeLink()] * 18)] * 6
        + [FakeGpu(power_mw=None, ecc_sbe_volatile=None, xid_events_supported=False), FakeGpu()]
    )
    sysfs = write_tree(
        tmp_path / "sys",
        {
            "class/infiniband/mlx5_0/ports/1/state": "4: ACTIVE\n",
            "class/infiniband/mlx5_0/ports/1/rate": "400 Gb/sec (4X NDR)\n",
            "class/infiniband/mlx5_0/ports/1/counters/port_xmit_data": "123\n",
            "class/net/eth0/operstate": "up\n",
        },
    )
    proc = write_tree(
        tmp_path / "proc",
        {
            "net/dev": "h1\nh2\n  eth0: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n",
            "loadavg": "0.50 0.40 0.30 1/100 42\n",
        },
    )
    sources: list[Source] = [
        NvmlSource(nvml=fake.module),
        HostSource(proc_root=str(proc)),
        NetSource(sys_root=str(sysfs), proc_root=str(proc)),
    ]
    fake.inject_xid(3, 43)
    fake.lose(7)
    message = telemetry_message(*(s.sample() for s in sources), seq=17)
    assert schemas.validate(message) is message
    assert schemas.decode(schemas.encode(message))["gpus"][7]["lost"] is True
    assert message["gpus"][3]["xids"] == [43] and "xids" not in message["gpus"][6]
    assert message["net"]["ib"][0]["tx_bytes"] == 492 and message["host"]["load1"] == 0.5
    # And with this machine's real /proc and /sys for host and net.
    real = telemetry_message(sources[0].sample(), HostSource().sample(), NetSource().sample())
    assert schemas.validate(real) is real and "mem_used_frac" in real["host"]
    for s in sources:
        s.close()
