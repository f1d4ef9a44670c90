"""The SQL text shipped with the package: one ``<name>.sql`` file per statement, ``$`` placeholders."""

from __future__ import annotations

import re
from functools import cache
from importlib.resources import files
from string import Template

_COMMENT = re.compile(r"^\s*--.*$\n?", re.MULTILINE)


@cache
def sql_template(name: str) -> Template:
    """The packaged ``sql/<name>.sql`` without its comment lines, as a ``$``-placeholder template."""
    text = files(__name__).joinpath(f"{name}.sql").read_text()
    return Template(_COMMENT.sub("", text).strip())


def quote(name: str) -> str:
    """A SQL identifier for a column name (keys contain ``/``)."""
    return '"' + name.replace('"', '""') + '"'
