"""The SQL of the ``episodes`` and ``steps`` views: the packaged statements (one ``<name>.sql`` file each,
``$`` placeholders), the ``steps`` columns of a schema, and the one DuckDB configuration of sandboxed SQL.

Here, below ``read`` and ``write``, because reads (views of a snapshot) and
commits (quality checks over the batch being committed) build the same views.
"""

from __future__ import annotations

import re
from functools import cache
from importlib.resources import files
from string import Template

import duckdb

from ...core.schema import DatasetSchema, FieldSpec

_COMMENT = re.compile(r"^\s*--.*$\n?", re.MULTILINE)
# The sandbox: no file system, network, extension or Python-object access (registered Arrow data only), and the
# configuration locked, so no statement can turn the access back on.
_SANDBOX: dict[str, str | bool | int | float | list[str]] = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}


@cache
def sql_template(name: str) -> Template:
    """The packaged ``sql/<name>.sql`` without its comment lines, as a ``$``-placeholder template."""
    text = files(__name__).joinpath(f"{name}.sql").read_text()
    return Template(_COMMENT.sub("", text).strip())


def quote(name: str) -> str:
    """A SQL identifier for a column name (keys contain ``/``)."""
    return '"' + name.replace('"', '""') + '"'


def next_key(f: FieldSpec) -> str:
    """Name of the ``steps`` column holding observation row ``t + 1`` of ``f``."""
    return f"next_{f.key}"


def steps_columns(schema: DatasetSchema, used: str | None = None) -> tuple[str, str]:
    """The ``$unnest`` and ``$columns`` of the ``steps`` template for ``schema``'s table step fields.

    ``used``: SQL text that names the only step columns it reads (an anchor
    predicate): the fields whose key it does not contain are left out, so
    DuckDB unnests only what the text can use (every unnest is evaluated).
    """
    unnest, columns = [], []
    for f in schema.table_step_fields:
        if used is not None and f.key.lower() not in used.lower():
            continue
        col = quote(f.key)
        if f.role == "observation":
            unnest.append(f"unnest({col}[1:length]) AS {col}")
            unnest.append(f"unnest({col}[2:length + 1]) AS {quote(next_key(f))}")
            columns += [col, quote(next_key(f))]
        else:
            unnest.append(f"unnest({col}) AS {col}")
            columns.append(col)
    return "".join(f",\n    {u}" for u in unnest), "".join(f",\n    {c}" for c in columns)


def connect(sandbox: bool) -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB database; ``sandbox``: external access off and the configuration locked."""
    if not sandbox:
        return duckdb.connect()
    con = duckdb.connect(config=_SANDBOX)
    con.execute("SET lock_configuration = true")
    return con
