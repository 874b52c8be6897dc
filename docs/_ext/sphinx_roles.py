"""Griffe extension: render sbfunc's reST-flavoured Google docstrings as Markdown.

sbfunc's docstrings are written for ``pydoc``, doctest and IDEs as much as for this site: they
use Sphinx roles (``:func:`sbfunc.top_k` ``) and a singular ``Example:`` section. This extension
rewrites both on the fly, before griffe parses the docstring, so the source stays as it is:

* ``:role:`~a.b.c` `` becomes ``c`` in code, ``:role:`a.b.c` `` becomes ``a.b.c`` in code;
* ``Example:`` becomes ``Examples:`` (griffe's Google parser turns ``>>>`` lines there into
  highlighted code blocks);
* an argument line that names several parameters (``a, b,`` wrapped onto ``c: text``) becomes
  one ``name: text`` line per parameter.

It runs locally at build time and needs no network.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|obj|exc|const):`(~?)([^`]+)`")
_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
_SHARED = re.compile(r"^( +)(\w+(?:, *\w+)*,)\n +((?:\w+, *)*\w+): (.*)$", re.MULTILINE)


def _role(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


def _shared(match: re.Match[str]) -> str:
    indent, head, tail, text = match.groups()
    names = [n.strip() for n in f"{head} {tail}".split(",")]
    return "\n".join(f"{indent}{name}: {text}" for name in names)


def markdownify(text: str) -> str:
    """The docstring ``text`` with Sphinx roles as code spans and ``Example:`` as ``Examples:``.

    >>> markdownify(":func:`~sbfunc.top_k` and :mod:`sbfunc.policies`")
    '`top_k` and `sbfunc.policies`'
    >>> markdownify("Summary.\\n\\nExample:\\n    >>> 1\\n    1")
    'Summary.\\n\\nExamples:\\n    >>> 1\\n    1'
    >>> markdownify("Args:\\n    a, b,\\n        c: flags.")
    'Args:\\n    a: flags.\\n    b: flags.\\n    c: flags.'
    """
    return _SHARED.sub(_shared, _EXAMPLE.sub(r"\1Examples:", _ROLE.sub(_role, text)))


class SphinxRoles(griffe.Extension):
    """Rewrite every docstring once, when griffe creates the object."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdownify(obj.docstring.value)
