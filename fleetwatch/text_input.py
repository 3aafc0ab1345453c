"""A text file a command reads, named on its command line ("-": stdin)."""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterable, Iterator
from typing import TextIO


def open_text(path: str, *, errors: str = "strict", newline: str | None = None) -> TextIO:
    """The file, or stdin for "-", as UTF-8 text with any byte order mark dropped (it is no part of
    the first line), decoding errors handled as `errors` says. A path that cannot be opened (missing,
    a directory, a symlink loop, no permission) is an argument error of one line: FileNotFoundError
    or ValueError, which fleetwatch.cli turns into status 2. The caller closes a file, not stdin."""
    if path == "-":
        return io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8-sig", errors=errors, newline=newline)
    try:
        return open(path, encoding="utf-8-sig", errors=errors, newline=newline)
    except FileNotFoundError:
        raise FileNotFoundError(f"no such file: {path}") from None
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from None


@contextlib.contextmanager
def read_lines(path: str, *, errors: str = "strict", newline: str | None = None) -> Iterator[Iterator[str]]:
    """The lines of open_text(path, ...), a file closed at the end (stdin is not); a read error part
    way through (EIO from a failing disk, a network file system gone) is a one-line error:
    ValueError, which fleetwatch.cli turns into status 2, with what was written until then standing."""
    source = open_text(path, errors=errors, newline=newline)
    try:
        yield _guarded(source, "stdin" if path == "-" else path)
    finally:
        if path != "-":
            source.close()


def _guarded(lines: Iterable[str], where: str) -> Iterator[str]:
    it = iter(lines)
    while True:
        try:
            item = next(it)
        except StopIteration:
            return
        except OSError as e:
            raise ValueError(f"cannot read {where}: {e.strerror or e}") from None
        yield item
