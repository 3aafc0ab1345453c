"""Reading sinfo's -O answers (alerts/slurm.py) in time linear in their size, with the grammar they
had when a regex read them: the regex stays here as the oracle, checked on every short text over the
characters that matter (the separator, a newline, a letter), and a few megabytes of garbage answer
at once (the regex took 30 s on 100 KB: a hung test here is that regression)."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwatch.alerts.slurm import _one_row, _sinfo_rows

SEP = "\x1e"
_PLAIN = r"[^\x1e\n]*\x1e"
ORACLE = re.compile(rf"({_PLAIN})({_PLAIN})({_PLAIN})(.*?\x1e)\n?(?={_PLAIN}{_PLAIN}{_PLAIN}|\Z)", re.DOTALL)


def by_oracle(text: str) -> list[tuple[str, ...]]:
    return [tuple(g[:-1] for g in m.groups()) for m in ORACLE.finditer(text)]


def one_row_by_oracle(text: str) -> str:
    """_one_row as first written: every separator tried as the end of the row."""
    row_end = text.find(SEP)
    while row_end != -1:
        row = text[: row_end + 1] + "\n"
        if len(text) % len(row) == 0 and row * (len(text) // len(row)) == text:
            return row[:-2]
        row_end = text.find(SEP, row_end + 1)
    return text[: text.rfind(SEP)]


def test_every_short_text_reads_as_the_regex_read_it() -> None:
    for n in range(11):  # 3^10 texts of 10 characters, all of them: 88,573 texts
        for chars in itertools.product(("a", SEP, "\n"), repeat=n):
            text = "".join(chars)
            assert _sinfo_rows(text) == by_oracle(text), repr(text)
            assert _one_row(text) == one_row_by_oracle(text), repr(text)


row = st.tuples(
    st.sampled_from(["gpu01", "gpu02", "", "gpu03"]),
    st.sampled_from(["idle", "drained", "mixed"]),
    st.sampled_from(["", "(null)", "a100,ib"]),
    st.text(alphabet=["x", " ", SEP, "\n", "|"], max_size=12),  # a Reason: free text
)


@given(
    st.lists(row, max_size=6),
    st.text(alphabet=["j", SEP, "\n"], max_size=8),
    st.booleans(),
)
@settings(max_examples=400, deadline=None)
def test_answers_of_rows_with_free_text_reasons_read_as_the_regex_read_them(
    rows: list[tuple[str, str, str, str]], garbage: str, newline_last: bool
) -> None:
    text = "".join(SEP.join(r) + SEP + "\n" for r in rows)
    text = text[:-1] if text and not newline_last else text
    for t in (text, garbage + text, text + garbage):
        assert _sinfo_rows(t) == by_oracle(t), repr(t)


def test_a_plain_answer_is_its_rows() -> None:
    text = f"gpu01{SEP}idle{SEP}a100{SEP}none{SEP}\ngpu02{SEP}drained{SEP}(null){SEP}fleetwatch: x\ny{SEP}\n"
    assert _sinfo_rows(text) == [
        ("gpu01", "idle", "a100", "none"),
        ("gpu02", "drained", "(null)", "fleetwatch: x\ny"),
    ]


@pytest.mark.parametrize(
    ("garbage", "rows", "one_row"),
    [
        ("\xff" * 4_000_000, 0, "\xff" * 3_999_999),  # no separator, no newline
        (SEP * 4_000_000, 1_000_000, SEP * 3_999_999),  # only separators: rows of four empty fields
        (("a" + SEP + "\n") * 1_000_000, 0, "a"),  # never three plain fields; "a" once per partition
        # rows whose reason never ends (no row follows, the answer does not end after a separator):
        # the regex searched from every line's start to the end of the answer
        ((SEP.join("abc") + SEP + "R\n") * 300_000 + "z", 0, None),
        # a length with 336 divisors, each a row's length that ends as a row does, none repeating:
        # each was tried in turn (0.8 s at this size)
        ((SEP + "\n") * (2_882_880 // 2 - 1) + SEP + "X", 0, None),
    ],
    ids=["text", "separators", "broken rows", "endless reasons", "many divisors"],
)
def test_megabytes_of_garbage_read_at_once(garbage: str, rows: int, one_row: str | None) -> None:
    got = _sinfo_rows(garbage)
    assert len(got) == rows and all(r == ("", "", "", "") for r in got)
    # no row repeats (None): all of it up to its last separator
    assert _one_row(garbage) == (garbage[: garbage.rfind(SEP)] if one_row is None else one_row)
