"""The runbooks (docs/runbooks/) as act serves them: every alert's `runbook_url` points at a page
of that folder, and by default at act's own web server (beside /metrics), so the links resolve on
every install, not only where a site has published the folder somewhere (--runbook-base).

The folder is installed with the package as `fleetwatch.runbook_pages` (pyproject.toml maps it to
docs/runbooks), so a wheel carries the same pages as the repository. Pages are served as UTF-8
plain text (Markdown reads well as it is, and a browser shows it inline), under /runbooks/<page>;
/runbooks/ lists them. Only names of the folder's own files are served: nothing a URL says can
reach another file.
"""

from __future__ import annotations

import html
import importlib.resources
import re
import socket
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

PREFIX = "/runbooks/"
_PAGE = re.compile(r"^[A-Za-z0-9_.-]{1,96}\.md$")

Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def folder() -> Path | None:
    """Where the pages are: the installed package's, else the repository's docs/runbooks."""
    try:
        path = Path(str(importlib.resources.files("fleetwatch.runbook_pages")))
        if path.is_dir():
            return path
    except (ModuleNotFoundError, TypeError):
        pass
    repo = Path(__file__).resolve().parent.parent / "docs" / "runbooks"
    return repo if repo.is_dir() else None


def pages(where: Path | None = None) -> dict[str, bytes]:
    """Every page by its file name, read once (a few dozen small files)."""
    where = folder() if where is None else where
    if where is None:
        return {}
    return {p.name: p.read_bytes() for p in sorted(where.glob("*.md")) if _PAGE.match(p.name)}


def default_base(port: int | None, addr: str) -> str:
    """act's own URL of the pages: http://<this host>:<metrics port>/runbooks/ (an address that is
    bound to all interfaces is named by the host's name, which on-call can reach)."""
    if not port:
        return PREFIX
    host = socket.getfqdn() if addr in ("0.0.0.0", "::", "") else addr
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{PREFIX}"


def _index(book: dict[str, bytes]) -> bytes:
    items = "".join(f'<li><a href="{html.escape(n)}">{html.escape(n)}</a></li>' for n in book)
    title = "<title>fleetwatch runbooks</title><h1>fleetwatch runbooks</h1>"
    return f"<!doctype html>{title}<ul>{items}</ul>".encode()


def with_runbooks(app: Wsgi, book: dict[str, bytes]) -> Wsgi:
    """`app` (the metrics), with the runbooks served beside it."""

    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if not path.startswith(PREFIX.rstrip("/")):
            return app(environ, start_response)
        name = path[len(PREFIX) :]
        if name in ("", "index.html"):
            body, kind, status = _index(book), "text/html; charset=utf-8", "200 OK"
        elif name in book:
            body, kind, status = book[name], "text/plain; charset=utf-8", "200 OK"
        else:
            body, kind, status = b"no such runbook page\n", "text/plain; charset=utf-8", "404 Not Found"
        start_response(status, [("Content-Type", kind), ("Content-Length", str(len(body)))])
        return [body]

    return serve
