"""Names and titles in ``report.md``, shown as what they are.

A protocol's name, a comparison's title, a grid value, a defense's or an attack's
name (a plugin's, any string) and a party's name come from files a user may have
received from someone else. Put raw into markdown, a line break in one starts a
heading or a list of the sender's choosing, a backtick ends the code span around
it, and ``<img src=x onerror=...>`` or ``<script>`` is HTML that a renderer may run.
Every such value goes into the report through one of these functions (CommonMark
0.31, GitHub-flavoured tables):

- :func:`code`: an inline code span, which shows its text literally (HTML
  included): its fence is longer than any run of backticks inside;
- :func:`text`: running text, every markdown and HTML character backslash-escaped
  (CommonMark, section 2.4: an escaped character is a literal character);
- :func:`cell`: a table cell's text (:func:`text`, whose ``\\|`` keeps the cell one cell).

In all three a control character (a line break among them) is written as its
escape (``\\n``, ``\\x1b``), so a value never leaves its line.
"""

from __future__ import annotations

import re
import unicodedata

#: characters that mean something to markdown or HTML inside a line. ``_`` is left as it is:
#: inside a word (``label_norm``) it starts no emphasis (CommonMark, section 6.2), and at a word's
#: edge it can only italicize, never link, run or break anything
_SPECIAL = re.compile(r"([\\`*\[\]<>&#|!~$])")
_BACKTICKS = re.compile(r"`+")


def one_line(value: object) -> str:
    """``str(value)`` with every control, line- or paragraph-separator character
    written as its Python escape."""
    out = []
    for ch in str(value):
        if unicodedata.category(ch) in ("Cc", "Zl", "Zp"):
            out.append(ch.encode("unicode_escape").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out)


def text(value: object) -> str:
    """``value`` as literal running text."""
    return _SPECIAL.sub(r"\\\1", one_line(value))


def cell(value: object) -> str:
    """``value`` as one table cell's literal text."""
    return text(value)


def code(value: object) -> str:
    """``value`` as an inline code span (shown literally, HTML included)."""
    body = one_line(value)
    longest = max((len(m) for m in _BACKTICKS.findall(body)), default=0)
    fence = "`" * (longest + 1)
    if body.startswith("`") or body.endswith("`") or not body.strip(" "):
        body = f" {body} "
    return f"{fence}{body}{fence}"
