"""Let the library's docstrings use plain mathematical text (|S|, a*b, theta_i) in the API page.

reStructuredText reads ``|S|`` as a substitution and ``*x`` as emphasis; the library writes
its docstrings for readers of the source, so this hook escapes both outside ``literals``.
"""

import re

_LITERAL = re.compile(r"(``.*?``|`[^`]*`)")


def _escape(line: str) -> str:
    parts = _LITERAL.split(line)
    for k in range(0, len(parts), 2):  # even parts are outside literals and roles
        parts[k] = parts[k].replace("|", "\\|").replace("*", "\\*")
    return "".join(parts)


def _process(app, what, name, obj, options, lines):
    lines[:] = [_escape(line) for line in lines]


def setup(app):
    app.connect("autodoc-process-docstring", _process, priority=400)
    return {"parallel_read_safe": True}
