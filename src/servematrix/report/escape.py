"""Escaping for the Markdown the report writes. Row fields (GPU kinds, matrix names, verdicts, log excerpts)
may come from any merged store, and mkdocs passes raw HTML in Markdown through to the site, so no field
may reach a page as markup.

- `text(value)`: a field as plain text anywhere in a page, table cells included, escaped for Markdown, so the
  Markdown source reads as the text it is: the characters that start markup or end a table cell are
  backslash-escaped (the escapes CommonMark and Python-Markdown share); `<` and `&` become `&lt;` and `&amp;`
  only where they could open a tag, an autolink or a reference (Python-Markdown has no backslash escape for
  them); `~` (GitHub's strikethrough, which Python-Markdown cannot escape) stays a numeric reference.
- `code(value)`: a field as inline code. A plain code span when that is safe (no backtick to end it, no
  pipe for a GitHub table to split on); otherwise an HTML `<code>` element with every special character
  written as a reference.
- `Markdown`: text that is already Markdown (written here, or the project's own signature data); it
  passes as is.

The HTML page is escaped by Jinja's autoescape instead (`site._environment`).
"""

from __future__ import annotations

import re
from urllib.parse import quote

# The renderer is mkdocs with the extensions in mkdocs.yml. Characters that open markup there: < > & (HTML,
# which md_in_html also reads), [ ] (links, images), \ and ` (escapes, code), | (ends a table cell), * ~
# (emphasis, which attr_list can then give attributes), { } = " ' (attr_list's `{: onmouseover="..."}`
# and toc's `{#id}`), # (headings). `_` stays: it is in every path and name, Python-Markdown emphasises
# it only between word boundaries, and with `{` escaped no attribute can follow it. In code (`code`), every ASCII
# character outside letters, digits and `_SAFE` is written as a numeric reference: Python-Markdown stashes references before attr_list looks at the text, and shows them
# as the character itself. Allowing a short list, not refusing a known one, keeps a new extension safe.
_SAFE = " .,:;/()+-@%?!$_"
_CODE_SPECIALS = {chr(c): f"&#{c};" for c in range(0x21, 0x7F) if not chr(c).isalnum() and chr(c) not in _SAFE}
# Markdown text (`text`): the same characters, written as Markdown escapes them. `\` escapes only what both
# CommonMark and Python-Markdown (with the tables extension, for `|`) unescape; `{` escaped is never attr_list's
# (Python-Markdown's escapes are placeholders until after attr_list and toc ran), so `" ' =` and `^` open nothing
# and stay as they are, as the text a reader reads. No field is written inside an HTML attribute.
_PLAIN = "\"'=^"
_BACKSLASHED = "\\`*[]{}#>|"
_TEXT_SPECIALS = {
    c: "\\" + c if c in _BACKSLASHED else ref for c, ref in _CODE_SPECIALS.items() if c not in _PLAIN + "<&"
}
# `<` may open a tag, a comment or an autolink (`<1@x>`), `&` a character reference, unless a space follows
# (at the end of a field, the next field may follow it: escaped).
_CONTEXTUAL = re.compile(r"[<&](?! )")
_SLUG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class Markdown(str):
    """Text that is Markdown already: not escaped again."""

    __slots__ = ()


def _one_line(value: object) -> str:
    """Every whitespace character a space: a line break would end a table row or a list item."""
    return re.sub(r"[^\S ]", " ", str(value)) if value is not None else ""


def text(value: object) -> Markdown:
    if isinstance(value, Markdown):
        return value
    line = _CONTEXTUAL.sub(lambda m: "&lt;" if m.group() == "<" else "&amp;", _one_line(value))
    return Markdown("".join(_TEXT_SPECIALS.get(c, c) for c in line))


def code(value: object) -> Markdown:
    line = _one_line(value)
    if "`" not in line and "|" not in line and line.strip():
        return Markdown(f"`{line}`")
    return Markdown("<code>" + "".join(_CODE_SPECIALS.get(c, c) for c in line) + "</code>")


def fragment(value: object) -> str:
    """A value as a URL fragment or path segment: percent-encoded, so it cannot end the link."""
    return quote(str(value), safe="")


def is_slug(value: str) -> bool:
    """Whether `value` can name a file or an anchor as is: letters, digits, `.`, `_`, `-`, and no leading dot."""
    return bool(_SLUG.fullmatch(value))


def slug(value: str, fallback: str) -> str:
    """`value` made fit for a file name: runs of other characters become `-`."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", value).strip("-.")
    return cleaned or fallback
