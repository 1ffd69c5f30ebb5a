"""Markdown text is escaped for Markdown: readable in the source, the same text once rendered, never markup."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from servematrix.report.escape import text

REPO = Path(__file__).resolve().parents[3]
FIELDS = [
    "GLM-5 DSA on SM12x: sglang's default backends (trtllm-gen FMHA)",
    "Piecewise graphs break on bypassed top-k (sglang < 0.5.13)",
    '*x*{: onmouseover="alert(document.domain)" }',
    "<b>bold</b> <script>alert(3)</script> <!-- c --> <https://x.y> <1@x.y>",
    "a|b `c` [l](u) #h >q ~17 starts a&b &amp; &#60; --x=1 --y='2' x\\y",
]
# The elements the writers' own layout renders to: a list, a table, bold.
LAYOUT = {"ul", "li", "ol", "strong", "p", "table", "thead", "tbody", "tr", "th", "td"}


def _rendered(source: str) -> str:
    md = pytest.importorskip("markdown")
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    return md.markdown(
        source, extensions=[e if isinstance(e, str) else next(iter(e)) for e in config["markdown_extensions"]]
    )


def test_prose_reads_as_itself_in_the_markdown_source():
    assert text(FIELDS[0]) == FIELDS[0]  # no &#39;
    assert text(FIELDS[1]) == FIELDS[1]  # no &#60;: "< " opens nothing
    assert text("--attention-backend=flashinfer") == "--attention-backend=flashinfer"
    assert not re.search(r"&#\d+;", text(FIELDS[0] + FIELDS[1] + FIELDS[2]))


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("where", ["- {}", "| a | {} |", "1. **{}** (x)"])
def test_every_field_renders_as_the_text_it_is_and_never_as_markup(field: str, where: str):
    source = (
        where.format(text(field)) if not where.startswith("|") else "| a | b |\n|---|---|\n" + where.format(text(field))
    )
    rendered = _rendered(source)
    tags = set(re.findall(r"<([a-z0-9]+)", rendered)) - LAYOUT
    assert tags == set(), (field, rendered)
    assert not re.search(r"<[a-z0-9]+[^>]*\son\w+=", rendered), rendered  # no element takes a handler
    shown = html.unescape(re.sub(r"<[^>]+>", "", rendered)).strip()
    assert field in shown, (field, shown)
