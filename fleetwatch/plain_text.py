"""Text from outside (a node's agent, a Slurm user, a diagnostic's output) made safe to put in what
others read as one line: an alert's summary, a Slurm reason, a log line, a chat message.

- `clean_text`: one bounded line. Control characters (a terminal's escape sequences, a carriage
  return or newline that would forge a log line), format characters (bidi overrides, zero-width),
  surrogates, private-use and unassigned characters, and line/paragraph separators become spaces.
- `no_markup`: the sequences chat receivers read as markup, made plain: `<` and `>` (Slack's
  `<!channel>`, `<@user>`, `<url|text>`) become the single guillemets, and `](` (a Markdown link)
  becomes `] (`. Alertmanager sends an annotation as it is; a receiver's template that shows the
  summary would otherwise let one node's made-up device name page a whole channel with a link.
- `plain_line`: both, the cut last (making markup plain lengthens a `](`): what a finding's summary
  is, and an alert's.
"""

from __future__ import annotations

import re
import unicodedata

_SPACES = re.compile(r"\s+")
_MARKUP = str.maketrans({"<": "\u2039", ">": "\u203a"})


def clean_text(value: object, limit: int = 200) -> str:
    """`value` as one bounded line (above), whitespace runs one space, and the result at most
    `limit` characters (an ellipsis marks a cut)."""
    if isinstance(value, str):
        text = value
    elif value is None or isinstance(value, bool | int | float):
        text = repr(value)
    else:  # no repr of a container: it may be nested deep enough to exhaust the stack
        text = f"<{type(value).__name__}>"
    text = text[: limit * 4]  # the cut comes after cleaning; bound the work before it
    chars = [
        " " if unicodedata.category(c)[0] == "C" or unicodedata.category(c) in ("Zl", "Zp") else c
        for c in text
    ]
    text = _SPACES.sub(" ", "".join(chars)).strip()
    if len(text) > limit:
        text = text[: limit - 3].rstrip() + "..."
    return text


def no_markup(text: str) -> str:
    """`text` with chat markup made plain (above)."""
    return text.translate(_MARKUP).replace("](", "] (")


def plain_line(text: str, limit: int) -> str:
    """`text` as one bounded line with no chat markup (above)."""
    return clean_text(no_markup(text), limit)
