"""tests/helpers/crash.py on a real crash: a child that dereferences NULL in native code (as
librdkafka did in CI) leaves a core file, and the helper reads the crashing thread's backtrace from
it with gdb and deletes it. gdb and core files in the working folder are what this project's
machines have (scripts/install.sh installs gdb); without them the helper says why it has nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers.crash import dumping_core, native_backtrace


def test_a_native_crash_is_reported_with_the_crashing_threads_frames(tmp_path: Path) -> None:
    r = subprocess.run(
        dumping_core([sys.executable, "-c", "import ctypes; ctypes.string_at(0)"]),
        cwd=tmp_path,
        capture_output=True,
        timeout=60,
    )
    assert r.returncode == -11
    report = native_backtrace(r.returncode, tmp_path)
    assert report.startswith("the crashing thread:\n#0 "), report
    assert "string_at" in report or "ctypes" in report.lower(), report
    assert not list(tmp_path.glob("core*"))  # hundreds of MB: deleted once read


def test_a_clean_exit_has_nothing_to_report(tmp_path: Path) -> None:
    assert native_backtrace(0, tmp_path) == "" and native_backtrace(1, tmp_path) == ""
