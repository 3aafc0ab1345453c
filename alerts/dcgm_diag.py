"""Reading the result of `dcgmi diag -r <level> -j` (and of a site's own validation command) to decide
whether a drained node may be resumed. Pure: no subprocess, no I/O; the caller runs the command and
passes its exit status and output here.

What dcgmi prints and returns (NVIDIA/DCGM, read at 72fa3fe = DCGM 4.6.0, b0ec3c6 = 3.3.9 and
6e947dc = 4.2.3; tests/fixtures/dcgm_diag/README.md has the details and the sources):

- **Two JSON shapes.** DCGM 3.x: `{"DCGM GPU Diagnostic": {"test_categories": [{"category", "tests":
  [{"name", "results": [{"gpu_id": "1", "status", "warnings": [{"warning", "error_id", ...}],
  "info"}]}]}]}, "version", "Driver Version Detected", ...}`; deployment tests carry one result and
  an integer `gpu_id` only where they report an error. DCGM 4.x: the root is `"DCGM Diagnostic"`,
  each result names its entity (`entity_group` "GPU", `entity_group_id` 1, `entity_id`), each test
  has a `test_summary` with the test's own status, and `entity_groups` and `metadata` sit beside the
  root. A run that could not complete prints `{"DCGM Diagnostic" (or 3.x's name): {"runtime_error":
  "...", "version": "..."}}` instead.
- **Statuses.** dcgmi's JSON holds "Pass", "Skip" or "Fail" only: a test's WARN result is written
  "Fail" there (Diag.cpp HelperDisplayDiagResult, in every version from 2.4 to 4.6), so DCGM's
  warnings (persistence mode off, for one) arrive as failures and fail validation here. "Warn" does
  appear in other producers' output (nvvs run directly, wrappers), and is honoured as below.
- **Exit status** = the dcgmReturn_t main() returns, truncated to a byte (DCGM's own test_dcgm_diag.py
  expects `c_uint8(DCGM_ST_NVVS_ERROR)`): 0 when nothing failed; 226 (DCGM_ST_NVVS_ERROR, -30) when
  a test reported an error; 205 (DCGM_ST_NVVS_ISOLATE_ERROR, -51) when one of the errors is of
  isolate severity (the GPU must be taken out of service); 235 (DCGM_ST_CONNECTION_NOT_VALID, -21)
  when no host engine answers; 1 for an argument the parser does not know (TCLAP); 254 (-2) for
  arguments it rejects after parsing; 203 (DCGM_ST_NVVS_KILLED, -53) when dcgmi was signalled during
  the run; 128 + n when signalled before it. Other DCGM statuses map the same way (256 + status).

The rules (`parse_diag`):

- A run passes only if the exit status is 0 AND the output holds a JSON document of a known shape
  AND no result or test summary says Fail AND at least one result says Pass AND, where the caller
  says how many GPUs Slurm configures on the node, that many distinct GPUs have a passing result
  (a run whose results name no GPU, 3.x's level 1, counts the GPUs it lists: `GPU Device IDs`,
  4.x `entity_groups`). A GPU lost from the bus (XID 79) is invisible to DCGM, never failed by it.
- **Skip does not fail**: DCGM skips tests that do not apply to a GPU's SKU, the run's privileges or
  configuration (EUD without root, stress tests on SKUs absent from diag-skus.yaml); failing those
  would keep healthy nodes drained for good. They are listed in `warnings`. A run in which nothing
  passed (everything skipped) is not evidence of health, though, and fails.
- **Warn does not fail**: DCGM's own exit status does not count a WARN result as a failure (3.x
  GetFailureResult looks at FAIL only). Warnings are listed in `warnings`. (dcgmi's JSON writes
  warnings as "Fail", see above, so this applies to other producers.)
- A status that is not one of those words (missing, of the wrong type, a word a future DCGM might
  add) fails: an unrecognised word is not evidence of health.
- Exit 0 with a Fail in the JSON fails (trust the stronger signal: 3.x exits 0 for a warning that
  its JSON calls Fail). A non-zero exit fails whatever the JSON says: the failures it names are
  listed, or, where it names none, the exit status and its meaning.
- Output that is not JSON, truncated, too big (over MAX_OUTPUT_CHARS, or cut by the caller's
  reader: `truncated`), nested too deep, with NaN, or of an unknown shape fails with a clear
  detail; nothing here raises.

Every string put in an outcome is bounded (MAX_TEXT) and stripped of control, format and
line-separator characters: it ends up in an alert and in Slurm's Reason.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from fleetwatch.plain_text import clean_text

MAX_OUTPUT_CHARS = 4 * 1024 * 1024  # parse at most this much output; more is a failure in itself
MAX_TEXT = 200  # every string in an outcome
MAX_FAILURES = 32  # failures listed (the detail counts them all)
MAX_WARNINGS = 32
_TAIL_CHARS = 64 * 1024  # parse_command looks for its last line in this much of each stream
_JSON_STARTS = 8  # a document may follow some other lines: try this many "{" at a line's start

SHAPE_DCGM4 = "dcgm4"
SHAPE_DCGM3 = "dcgm3"
SHAPE_NONE = "none"
ROOT_DCGM4 = "DCGM Diagnostic"
ROOT_DCGM3 = "DCGM GPU Diagnostic"

# dcgmi's exit statuses (dcgmlib/dcgm_structs.h dcgmReturn_t, as a byte)
EXIT_OK = 0
EXIT_USAGE = 1  # TCLAP: an unknown argument or a missing value
EXIT_NVVS_ERROR = 226  # DCGM_ST_NVVS_ERROR (-30): the diagnostic reported an error
EXIT_NVVS_ISOLATE_ERROR = 205  # DCGM_ST_NVVS_ISOLATE_ERROR (-51): an error that isolates the GPU
EXIT_CONNECTION_NOT_VALID = 235  # DCGM_ST_CONNECTION_NOT_VALID (-21): no host engine
EXIT_NVVS_KILLED = 203  # DCGM_ST_NVVS_KILLED (-53): dcgmi was signalled during the run
EXIT_CMDLINE_REJECTED = 254  # main()'s -2: arguments rejected after parsing

# names of the DCGM statuses a dcgmi exit can carry (dcgm_structs.h, DCGM 4.6.0)
_DCGM_STATUS = {
    -1: "DCGM_ST_BADPARAM",
    -2: "command line rejected",
    -3: "DCGM_ST_GENERIC_ERROR",
    -4: "DCGM_ST_MEMORY",
    -5: "DCGM_ST_NOT_CONFIGURED",
    -6: "DCGM_ST_NOT_SUPPORTED",
    -7: "DCGM_ST_INIT_ERROR",
    -8: "DCGM_ST_NVML_ERROR",
    -9: "DCGM_ST_PENDING",
    -10: "DCGM_ST_UNINITIALIZED",
    -11: "DCGM_ST_TIMEOUT",
    -12: "DCGM_ST_VER_MISMATCH",
    -13: "DCGM_ST_UNKNOWN_FIELD",
    -14: "DCGM_ST_NO_DATA",
    -15: "DCGM_ST_STALE_DATA",
    -16: "DCGM_ST_NOT_WATCHED",
    -17: "DCGM_ST_NO_PERMISSION",
    -18: "DCGM_ST_GPU_IS_LOST",
    -19: "DCGM_ST_RESET_REQUIRED",
    -20: "DCGM_ST_FUNCTION_NOT_FOUND",
    -21: "DCGM_ST_CONNECTION_NOT_VALID: no host engine",
    -22: "DCGM_ST_GPU_NOT_SUPPORTED",
    -23: "DCGM_ST_GROUP_INCOMPATIBLE",
    -24: "DCGM_ST_MAX_LIMIT",
    -25: "DCGM_ST_LIBRARY_NOT_FOUND",
    -26: "DCGM_ST_DUPLICATE_KEY",
    -27: "DCGM_ST_GPU_IN_SYNC_BOOST_GROUP",
    -28: "DCGM_ST_GPU_NOT_IN_SYNC_BOOST_GROUP",
    -29: "DCGM_ST_REQUIRES_ROOT",
    -30: "DCGM_ST_NVVS_ERROR: the diagnostic reported an error",
    -31: "DCGM_ST_INSUFFICIENT_SIZE",
    -32: "DCGM_ST_FIELD_UNSUPPORTED_BY_API",
    -33: "DCGM_ST_MODULE_NOT_LOADED",
    -34: "DCGM_ST_IN_USE",
    -35: "DCGM_ST_GROUP_IS_EMPTY",
    -36: "DCGM_ST_PROFILING_NOT_SUPPORTED",
    -37: "DCGM_ST_PROFILING_LIBRARY_ERROR",
    -38: "DCGM_ST_PROFILING_MULTI_PASS",
    -39: "DCGM_ST_DIAG_ALREADY_RUNNING",
    -40: "DCGM_ST_DIAG_BAD_JSON",
    -41: "DCGM_ST_DIAG_BAD_LAUNCH",
    -42: "DCGM_ST_DIAG_UNUSED",
    -43: "DCGM_ST_DIAG_THRESHOLD_EXCEEDED",
    -44: "DCGM_ST_INSUFFICIENT_DRIVER_VERSION",
    -45: "DCGM_ST_INSTANCE_NOT_FOUND",
    -46: "DCGM_ST_COMPUTE_INSTANCE_NOT_FOUND",
    -47: "DCGM_ST_CHILD_NOT_KILLED",
    -48: "DCGM_ST_3RD_PARTY_LIBRARY_ERROR",
    -49: "DCGM_ST_INSUFFICIENT_RESOURCES",
    -50: "DCGM_ST_PLUGIN_EXCEPTION",
    -51: "DCGM_ST_NVVS_ISOLATE_ERROR: a GPU must be isolated",
    -52: "DCGM_ST_NVVS_BINARY_NOT_FOUND",
    -53: "DCGM_ST_NVVS_KILLED: dcgmi was signalled",
    -54: "DCGM_ST_PAUSED",
    -55: "DCGM_ST_ALREADY_INITIALIZED",
    -56: "DCGM_ST_NVML_NOT_LOADED",
    -57: "DCGM_ST_NVML_DRIVER_TIMEOUT",
    -58: "DCGM_ST_NVVS_NO_AVAILABLE_TEST",
    -59: "DCGM_ST_MNDIAG_CONNECTION_NOT_AVAILABLE",
    -60: "DCGM_ST_MNDIAG_CONNECTION_UNAUTHORIZED",
    -61: "DCGM_ST_REMOTE_SSH_CONNECTION_FAILED",
    -62: "DCGM_ST_CHILD_SPAWN_FAILED",
    -63: "DCGM_ST_FILE_IO_ERROR",
    -64: "DCGM_ST_CHILD_SIGNAL_RECEIVED",
    -65: "DCGM_ST_CALLER_ALREADY_STOPPED",
    -66: "DCGM_ST_DIAG_STOPPED",
    -67: "DCGM_ST_GPUS_DETACHED",
}

_PASS, _SKIP, _WARN, _FAIL = "pass", "skip", "warn", "fail"
_STATUS_WORDS = {
    "pass": _PASS,
    "passed": _PASS,
    "skip": _SKIP,
    "skipped": _SKIP,
    "not run": _SKIP,  # DCGM 4.6's text for NOT_RUN (the JSON leaves such results out)
    "warn": _WARN,
    "warning": _WARN,
    "fail": _FAIL,
    "failed": _FAIL,
}
_GPU_GROUP_ID = 1  # DCGM_FE_GPU
_LINE_START_BRACE = re.compile(r"^[ \t]*\{", re.MULTILINE)
_SPACES = re.compile(r"\s+")
_GPU_NUMBER = re.compile(r"[0-9]{1,6}")  # ASCII only: str.isdigit() takes "²", which int() refuses


@dataclass(frozen=True)
class DiagFailure:
    test: str  # the test's name as DCGM spells it ("memory", "GPU Memory", "software"), or "dcgmi"
    gpu: int | None  # the GPU the failure names, where it names one
    message: str  # DCGM's explanation, bounded and cleaned


@dataclass(frozen=True)
class DiagOutcome:
    passed: bool
    shape: str  # "dcgm4" | "dcgm3" | "none"
    failures: tuple[DiagFailure, ...] = ()
    warnings: tuple[str, ...] = ()
    detail: str = ""


def exit_meaning(returncode: int) -> str:
    """What a dcgmi exit status says: its DCGM status name, a signal, or a usage error."""
    if returncode == EXIT_OK:
        return "success"
    if returncode < 0:
        return f"killed by signal {-returncode}"
    if returncode == EXIT_USAGE:
        return "usage error"
    if returncode in (126, 127):
        return "command not executable" if returncode == 126 else "command not found"
    if 128 < returncode < 160:
        return f"signal {returncode - 128}"
    status = _DCGM_STATUS.get(returncode - 256) if 128 < returncode < 256 else None
    return status or "unknown exit status"


def _exit_text(returncode: int) -> str:
    return f"exit {returncode} ({exit_meaning(returncode)})"


def _first_line(text: str) -> str:
    for line in text[:_TAIL_CHARS].splitlines():
        if line.strip():
            return clean_text(line)
    return "(no output)"


def _last_line(text: str) -> str:
    for line in reversed(text[-_TAIL_CHARS:].splitlines()):
        if line.strip():
            return clean_text(line)
    return ""


def _as_text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return value if isinstance(value, str) else str(value)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} in JSON")


def _load_json(text: str) -> tuple[Any, str]:
    """The JSON document in `text`: the first one of a known shape that starts a line (dcgmi may
    print other lines first), else the first one at all. (document, "") or (None, why not)."""
    decoder = json.JSONDecoder(parse_constant=_reject_constant)
    first_doc: Any = None
    why = ""
    for i, m in enumerate(_LINE_START_BRACE.finditer(text)):
        if i >= _JSON_STARTS:
            break
        try:
            doc, _ = decoder.raw_decode(text, m.end() - 1)
        except RecursionError:
            return None, "JSON nested too deep"
        except (ValueError, MemoryError) as e:  # JSONDecodeError is a ValueError; so are huge ints
            why = why or f"not valid JSON, truncated? ({clean_text(str(e), 80)})"
            continue
        if _root_key(doc) is not None:
            return doc, ""
        if first_doc is None and not why:
            first_doc = doc
    if first_doc is not None:
        return first_doc, ""
    return None, why or "no JSON document"


def _root_key(doc: Any) -> str | None:
    if isinstance(doc, dict):
        for key in (ROOT_DCGM4, ROOT_DCGM3):
            if isinstance(doc.get(key), dict):
                return key
    return None


@dataclass
class _Tally:
    failures: list[DiagFailure] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    failed: int = 0
    warned: int = 0
    passed: int = 0
    tests: int = 0
    results: int = 0
    gpu_results: int = 0  # results that name a GPU
    gpus_passed: set[int] = field(default_factory=set)  # the GPUs with a result that passed

    def fail(self, test: str, gpu: int | None, message: str) -> None:
        self.failed += 1
        if len(self.failures) < MAX_FAILURES:
            self.failures.append(DiagFailure(clean_text(test), gpu, clean_text(message)))

    def warn(self, text: str) -> None:
        self.warned += 1
        if len(self.warnings) < MAX_WARNINGS:
            self.warnings.append(clean_text(text))


def _status(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    return _STATUS_WORDS.get(_SPACES.sub(" ", value.strip().lower()))


def _gpu_number(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value < 1_000_000 else None
    if isinstance(value, str) and _GPU_NUMBER.fullmatch(value.strip()):
        return int(value.strip())
    return None


def _entity(result: dict[str, Any]) -> tuple[int | None, str]:
    """(the GPU a result names, a label for an entity that is not a GPU or not a number)."""
    if "entity_id" in result or "entity_group" in result or "entity_group_id" in result:
        group = result.get("entity_group")
        is_gpu = result.get("entity_group_id") == _GPU_GROUP_ID or (
            isinstance(group, str) and group.strip().upper() == "GPU"
        )
        number = _gpu_number(result.get("entity_id"))
        if is_gpu and number is not None:
            return number, ""
        name = clean_text(group, 20) if isinstance(group, str) and group.strip() else "entity"
        return None, f"{name} {clean_text(result.get('entity_id'), 20)}"
    for key in ("gpu_id", "gpu_ids"):
        if key in result:
            number = _gpu_number(result[key])
            if number is None and isinstance(result[key], list) and len(result[key]) == 1:
                number = _gpu_number(result[key][0])
            return number, ("" if number is not None else f"GPUs {clean_text(result[key], 40)}")
    return None, ""


def _messages(entry: dict[str, Any]) -> str:
    """DCGM's explanation in a result or test summary: its warnings (3.x's deployment tests key
    each one "warnings", the rest "warning"), else its info."""
    found: list[str] = []
    warnings = entry.get("warnings")
    for w in warnings if isinstance(warnings, list) else [warnings]:
        if isinstance(w, dict):
            w = w.get("warning", w.get("warnings"))
        if isinstance(w, str) and w.strip():
            found.append(w)
        if len(found) >= 3:
            break
    if not found:
        info = entry.get("info")
        for i in info if isinstance(info, list) else [info]:
            if isinstance(i, str) and i.strip():
                found.append(i)
                break
    return "; ".join(found)


def _walk(root: dict[str, Any], tally: _Tally) -> None:
    error = root.get("runtime_error")
    if error is not None:
        tally.fail("dcgmi", None, f"runtime error: {error if isinstance(error, str) else 'unreadable'}")
    categories = root.get("test_categories")
    if categories is None:
        return
    if not isinstance(categories, list):
        tally.fail("dcgmi", None, "malformed output: test_categories is not a list")
        return
    for category in categories:
        tests = category.get("tests") if isinstance(category, dict) else None
        if not isinstance(tests, list):
            tally.fail("dcgmi", None, "malformed output: a test category without a list of tests")
            continue
        for test in tests:
            if not isinstance(test, dict):
                tally.fail("dcgmi", None, "malformed output: a test that is not an object")
                continue
            _walk_test(test, tally)


def _walk_test(test: dict[str, Any], tally: _Tally) -> None:
    name = test.get("name")
    name = clean_text(name, 60) if isinstance(name, str) and name.strip() else "unnamed test"
    tally.tests += 1
    results = test.get("results", [])
    if not isinstance(results, list):
        tally.fail(name, None, "malformed output: results is not a list")
        results = []
    entity_failed = False
    for result in results:
        tally.results += 1
        if not isinstance(result, dict):
            tally.fail(name, None, "malformed output: a result that is not an object")
            entity_failed = True
            continue
        gpu, label = _entity(result)
        where = f" on GPU {gpu}" if gpu is not None else (f" on {label}" if label else "")
        status = _status(result.get("status"))
        if gpu is not None:
            tally.gpu_results += 1
        if status == _PASS:
            tally.passed += 1
            if gpu is not None:
                tally.gpus_passed.add(gpu)
        elif status == _SKIP:
            tally.warn(f"{name} skipped{where}")
        elif status == _WARN:
            tally.warn(f"{name} warned{where}: {_messages(result) or 'no message'}")
        else:
            if status == _FAIL:
                text = _messages(result) or "failed"
            else:
                text = f"unrecognised status {clean_text(result.get('status'), 40)}"
            tally.fail(name, gpu, f"{label}: {text}" if label else text)
            entity_failed = True
    summary = test.get("test_summary")
    if summary is None:
        return
    status = _status(summary.get("status")) if isinstance(summary, dict) else None
    if status == _FAIL and not entity_failed:
        tally.fail(name, None, _messages(summary) or "failed")
    elif status is None:
        tally.fail(name, None, "malformed test_summary")
    elif status == _WARN and not entity_failed:
        tally.warn(f"{name} warned: {_messages(summary) or 'no message'}")
    elif status == _SKIP and not results:
        tally.warn(f"{name} skipped")
    elif status == _PASS and not results:
        tally.passed += 1


def _gpus_shown(doc: dict[str, Any], tally: _Tally) -> int:
    """How many GPUs the run showed healthy: those with a passing result; in a run whose results
    name no GPU (DCGM 3.x at level 1: deployment tests only), those it lists as tested (3.x `GPU
    Device IDs`, 4.x `entity_groups`)."""
    if tally.gpu_results:
        return len(tally.gpus_passed)
    listed = doc.get("GPU Device IDs")
    if isinstance(listed, list):
        return len(listed)
    groups = doc.get("entity_groups")
    for group in groups if isinstance(groups, list) else []:
        if isinstance(group, dict) and (
            group.get("entity_group_id") == _GPU_GROUP_ID or group.get("entity_group") == "GPU"
        ):
            entities = group.get("entities")
            return len(entities) if isinstance(entities, list) else 0
    return 0


def _outcome(passed: bool, shape: str, tally: _Tally, detail: str) -> DiagOutcome:
    return DiagOutcome(
        passed=passed,
        shape=shape,
        failures=tuple(tally.failures),
        warnings=tuple(tally.warnings),
        detail=clean_text(detail),
    )


def parse_diag(stdout: str, returncode: int, expected_gpus: int = 0, truncated: bool = False) -> DiagOutcome:
    """The outcome of one `dcgmi diag -r <level> -j` run from its stdout and exit status. Never
    raises. It passes only with exit 0, a JSON document of a known shape, no Fail (or unrecognised
    status) anywhere, at least one Pass, and, where `expected_gpus` (the count Slurm configures on
    the node) is given, that many GPUs tested and passed. Skip and Warn do not fail (DCGM skips what
    does not apply to a SKU or configuration, and its own exit status does not count warnings) but
    are listed in `warnings`; the module's docstring has the details and the sources. `truncated`:
    the caller kept only part of the output (it fails, as output over MAX_OUTPUT_CHARS does)."""
    try:
        return _parse_diag(_as_text(stdout), returncode, expected_gpus, truncated)
    except Exception as e:  # the rules above should leave nothing; a validation must still answer
        failure = DiagFailure("dcgmi", None, clean_text(f"unreadable output ({type(e).__name__})"))
        return DiagOutcome(False, SHAPE_NONE, (failure,), (), failure.message)


def _parse_diag(text: str, returncode: object, expected_gpus: int, truncated: bool) -> DiagOutcome:
    tally = _Tally()
    if not isinstance(returncode, int) or isinstance(returncode, bool):
        tally.fail("dcgmi", None, f"no exit status ({clean_text(returncode, 40)})")
        return _outcome(False, SHAPE_NONE, tally, "dcgmi diag gave no exit status")
    exit_text = _exit_text(returncode)
    if truncated or len(text) > MAX_OUTPUT_CHARS:
        size = "cut by the reader" if truncated else f"{len(text)} characters"
        tally.fail("dcgmi", None, f"{exit_text}; output too large ({size})")
        return _outcome(False, SHAPE_NONE, tally, f"dcgmi diag {exit_text}: output over {MAX_OUTPUT_CHARS}")
    doc, why = _load_json(text)
    root_key = _root_key(doc)
    if root_key is None:
        why = why or "JSON of an unknown shape"
        tally.fail("dcgmi", None, f"{exit_text}; {why}: {_first_line(text)}")
        return _outcome(False, SHAPE_NONE, tally, f"dcgmi diag {exit_text}: {why}")
    shape = SHAPE_DCGM4 if root_key == ROOT_DCGM4 else SHAPE_DCGM3
    _walk(doc[root_key], tally)
    counts = (
        f"{tally.tests} tests, {tally.passed} passed, {tally.failed} failed, {tally.warned} skipped/warned"
    )
    if returncode != EXIT_OK and not tally.failed:
        tally.fail("dcgmi", None, f"{exit_text} though no test in its JSON failed")
    elif returncode == EXIT_OK and not tally.failed and not tally.passed:
        tally.fail("dcgmi", None, "no test passed" + (" (all skipped)" if tally.warned else ""))
    elif returncode == EXIT_OK and not tally.failed and _gpus_shown(doc, tally) < expected_gpus:
        tally.fail(
            "dcgmi",
            None,
            f"only {_gpus_shown(doc, tally)} of the {expected_gpus} GPUs Slurm configures on the node "
            "were tested and passed (a GPU DCGM cannot see is never tested)",
        )
    passed = returncode == EXIT_OK and not tally.failures
    verdict = "passed" if passed else "failed"
    return _outcome(passed, shape, tally, f"dcgmi diag {verdict} ({shape}, {exit_text}): {counts}")


def parse_command(returncode: int, stdout: str | None, stderr: str | None) -> DiagOutcome:
    """The outcome of a site's own validation command (an NCCL all-reduce, a burn-in script): exit 0
    passes; anything else fails, with the last non-empty line of stderr (else stdout) as the
    message. Never raises."""
    try:
        if not isinstance(returncode, int) or isinstance(returncode, bool):
            message = f"no exit status ({clean_text(returncode, 40)})"
        elif returncode == EXIT_OK:
            return DiagOutcome(True, SHAPE_NONE, (), (), "validation command passed (exit 0)")
        else:
            code = f"exit {returncode}" if returncode >= 0 else f"killed by signal {-returncode}"
            last = _last_line(_as_text(stderr)) or _last_line(_as_text(stdout)) or "(no output)"
            message = f"{code}: {last}"
    except Exception as e:
        message = f"unreadable result ({type(e).__name__})"
    failure = DiagFailure("validation command", None, clean_text(message))
    return DiagOutcome(False, SHAPE_NONE, (failure,), (), clean_text(f"validation command failed: {message}"))


def summary(outcome: DiagOutcome, label: str = "dcgmi diag") -> str:
    """One short line for Slurm's Reason and an alert's summary, e.g. "dcgmi diag -r 1: memory
    failed on GPU 3" (`label` names the command: "dcgmi diag -r 1", "nccl all-reduce")."""
    label = clean_text(label, 60) or "validation"
    if outcome.passed:
        extra = f" ({len(outcome.warnings)} skipped/warned)" if outcome.warnings else ""
        return clean_text(f"{label}: passed{extra}")
    if not outcome.failures:
        return clean_text(f"{label}: failed: {outcome.detail or 'no detail'}")
    first = outcome.failures[0]
    same = [f for f in outcome.failures if f.test == first.test]
    others = len(outcome.failures) - len(same)
    more = f" (+{others} more)" if others else ""
    gpus = sorted({f.gpu for f in same if f.gpu is not None})
    if first.test in ("dcgmi", "validation command"):
        return clean_text(f"{label}: {first.message}{more}")
    if gpus:
        on = f"GPU {gpus[0]}" if len(gpus) == 1 else "GPUs " + ",".join(map(str, gpus))
        return clean_text(f"{label}: {first.test} failed on {on}{more}")
    return clean_text(f"{label}: {first.test} failed: {first.message}{more}")
