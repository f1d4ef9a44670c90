"""The SQL of the ``episodes`` and ``steps`` views: the packaged statements (one ``<name>.sql`` file each,
``$`` placeholders), the ``steps`` columns of a schema, and sandboxed SQL: its one DuckDB configuration,
the allow-list of what its statements may name, and the time limit of its queries.

Here, below ``read`` and ``write``, because reads (views of a snapshot) and
commits (quality checks over the batch being committed) build the same views
and run the same sandboxed SQL.

Sandboxed SQL is held three ways: the database (no external access, no
extension loading, configuration locked: :func:`connect`); the statement
(:func:`check_sandboxed`: an allow-list over DuckDB's parsed tree, so it
reads the dataset's views and calls plain functions only, nothing about the
machine or the database); and the time (:func:`limited`: a watcher thread
interrupts a query at its limit, :func:`default_timeout` or the enclosing
:func:`query_limits`).
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cache, lru_cache
from importlib.resources import files
from string import Template
from typing import Any

import duckdb

from ...core.errors import ArgumentError, QueryError
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


# ---- what sandboxed SQL may name: the views, and plain scalar, aggregate and window functions

VIEWS = frozenset({"episodes", "steps"})  # the only tables sandboxed SQL may read (besides its own CTEs)
# Functions that answer questions about the machine, the process or the database rather than about values:
# refused even where DuckDB lists them as plain scalar functions (the rest of the allow-list is DuckDB's own
# list of scalar, aggregate and window functions, so it follows the installed version).
_DENIED_FUNCTION = re.compile(
    r"^(duckdb_|pragma_|pg_|read_|has_.*_privilege$|inet_|__|current_(?!date$|localtime$|localtimestamp$)|"
    r"(version|getenv|getvariable|session_user|user|in_search_path|col_description|obj_description|"
    r"shobj_description|txid_current|nextval|currval|setval|setseed|sleep_ms|write_log|get_block_size|"
    r"parse_duckdb_log_message|glob|query|query_table|sql_auto_complete|which_secret|json_serialize_plan|"
    r"json_execute_serialized_sql|checkpoint|force_checkpoint|enable_logging|disable_logging)$)"
)
_SPECIAL_FUNCTIONS = frozenset({"unnest", "unlist"})  # expression-only forms DuckDB lists as table functions
_WINDOW_FUNCTIONS = frozenset(
    {"row_number", "rank", "dense_rank", "rank_dense", "percent_rank", "cume_dist", "ntile", "lag", "lead"}
    | {"first_value", "last_value", "nth_value", "fill"}
)
_EXPRESSIONS = frozenset(
    {"BETWEEN", "CASE", "CAST", "COLLATE", "COLUMN_REF", "COMPARISON", "CONJUNCTION", "CONSTANT", "DEFAULT"}
    | {"FUNCTION", "LAMBDA", "LAMBDA_REF", "OPERATOR", "PARAMETER", "POSITIONAL_REFERENCE", "STAR", "SUBQUERY"}
    | {"TYPE", "WINDOW"}
)
_QUERY_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"})
_TABLE_REFS = frozenset({"BASE_TABLE", "JOIN", "SUBQUERY", "EMPTY", "EMPTY_FROM", "EXPRESSION_LIST", "PIVOT"})
_PARSER: dict[int, tuple[duckdb.DuckDBPyConnection, frozenset[str]]] = {}  # pid -> (plain database, functions)
_PARSER_LOCK = threading.Lock()


_BUILTIN_SCHEMAS = frozenset({"", "main", "system.main"})


class SandboxRefusal(Exception):
    """Internal: what the allow-list refused in a statement (see :func:`check_sandboxed`)."""


def _parser() -> tuple[duckdb.DuckDBPyConnection, frozenset[str]]:
    """This process's plain in-memory database (it parses, never runs user SQL) and the functions allowed.

    The allowed functions: DuckDB's scalar, aggregate, macro and window
    functions less the denied ones (``_DENIED_FUNCTION``). Callers hold ``_PARSER_LOCK``.
    """
    entry = _PARSER.get(os.getpid())
    if entry is None:
        con = duckdb.connect()
        rows = con.execute(
            "SELECT DISTINCT function_name FROM duckdb_functions() "
            "WHERE function_type IN ('scalar', 'aggregate', 'macro', 'window')"
        ).fetchall()
        names = {str(name).lower() for (name,) in rows} | _SPECIAL_FUNCTIONS | _WINDOW_FUNCTIONS
        entry = _PARSER[os.getpid()] = (con, frozenset(n for n in names if not _DENIED_FUNCTION.match(n)))
    return entry


def _cte_query(value: Any) -> Any:
    """The query node of one ``cte_map`` entry (DuckDB 2.x: ``query_node``; 1.x: ``query.node``)."""
    if not isinstance(value, dict):
        return None
    node = value.get("query_node")
    if node is None and isinstance(value.get("query"), dict):
        node = value["query"].get("node", value["query"])
    return node


class _AllowList:
    """A walk over DuckDB's parsed tree (``json_serialize_sql``) raising :class:`SandboxRefusal` at what it refuses.

    Tolerant of the tree's shape (DuckDB 1.5 and 2.x differ in places): every
    dict is judged by its ``class`` (an expression), its ``type`` ending in
    ``_NODE`` (a query node) or its ``sample`` key (a table reference); anything
    of those kinds that is not known is refused, everything else is walked.
    A table reference must be a view of :data:`VIEWS` or a CTE in scope (the
    CTEs of an enclosing WITH; inside a CTE's own body, those before it, and
    itself when it is recursive), unqualified and without ``AT``.
    """

    def __init__(self, functions: frozenset[str]) -> None:
        self.functions = functions

    def walk(self, node: Any, scope: frozenset[str]) -> None:
        if isinstance(node, list):
            for item in node:
                self.walk(item, scope)
            return
        if not isinstance(node, dict):
            return
        items = node
        ctes = node.get("cte_map")
        if isinstance(ctes, dict) and ctes.get("map"):
            names: list[str] = []
            for entry in ctes["map"]:
                name = str(entry.get("key", "")).lower()
                query = _cte_query(entry.get("value"))
                recursive = isinstance(query, dict) and query.get("type") == "RECURSIVE_CTE_NODE"
                self.walk(entry.get("value"), scope | set(names) | ({name} if recursive else set()))
                names.append(name)
            scope = scope | set(names)
            items = {k: v for k, v in node.items() if k != "cte_map"}
        kind = node.get("type")
        if "class" in node:
            self._expression(node)
        elif isinstance(kind, str) and kind.endswith("_NODE"):
            if kind not in _QUERY_NODES:
                raise SandboxRefusal(f"a {kind.lower().replace('_', ' ')}")
        elif "sample" in node and isinstance(kind, str):
            self._table(node, kind, scope)
        for value in items.values():
            self.walk(value, scope)

    def _expression(self, node: dict[str, Any]) -> None:
        cls = node["class"]
        if cls not in _EXPRESSIONS:
            raise SandboxRefusal(f"a {str(cls).lower()} expression")
        if cls in ("FUNCTION", "WINDOW"):
            name = str(node.get("function_name", ""))
            qualifier = ".".join(str(node[k]) for k in ("catalog", "schema") if node.get(k))
            # DuckDB 1.5 rewrites list comprehensions into main.list_apply(): the built-in schema
            # names a function already judged by its name below; any other qualifier is refused
            if qualifier not in _BUILTIN_SCHEMAS:
                raise SandboxRefusal(f"function {qualifier}.{name}()")
            if node.get("is_operator") and cls == "FUNCTION":
                return  # +, ~~ (LIKE), ||, ...: the parser's operators
            if name.lower() not in self.functions:
                raise SandboxRefusal(f"function {name}()")

    def _table(self, node: dict[str, Any], kind: str, scope: frozenset[str]) -> None:
        if kind == "TABLE_FUNCTION":
            function = node.get("function")
            name = function.get("function_name", "?") if isinstance(function, dict) else "?"
            raise SandboxRefusal(f"table function {name}()")
        if kind == "SHOW_REF":
            raise SandboxRefusal("SHOW/DESCRIBE/SUMMARIZE")
        if kind not in _TABLE_REFS:
            raise SandboxRefusal(f"a {kind.lower().replace('_', ' ')} table reference")
        if kind != "BASE_TABLE":
            return
        name = str(node.get("table_name", ""))
        qualifier = ".".join(str(node[k]) for k in ("catalog_name", "schema_name") if node.get(k))
        if qualifier:
            raise SandboxRefusal(f"table {qualifier}.{name}")
        if node.get("at_clause"):
            raise SandboxRefusal(f"table {name} AT (...)")
        if name.lower() not in VIEWS and name.lower() not in scope:
            raise SandboxRefusal(f"table {name}")


@lru_cache(maxsize=512)
def _refusal(query: str) -> str | None:
    """What the allow-list refuses in ``query`` (one SELECT statement), else None; cached per text."""
    with _PARSER_LOCK:
        con, functions = _parser()
        (text,) = con.execute("SELECT json_serialize_sql(?)", [query]).fetchone() or ("{}",)
    tree = json.loads(text)
    if tree.get("error"):
        return f"a statement it cannot check ({tree.get('error_message', 'not a plain SELECT')})"
    statements = tree.get("statements") or []
    if len(statements) != 1:
        return f"{len(statements)} statements"
    try:
        _AllowList(functions).walk(statements[0], frozenset())
    except SandboxRefusal as refused:
        return str(refused)
    return None


REFUSED = (
    "refused, sandboxed SQL reads nothing but the dataset's episodes and steps views "
    "and calls plain scalar, aggregate and window functions only"
)


def check_sandboxed(query: str, what: str) -> None:
    """:class:`QueryError` naming what ``query`` reaches beyond the allow-list of sandboxed SQL, else nothing.

    ``query``: one SELECT statement (callers check that first). The
    allow-list: table references name :data:`VIEWS` or a CTE of the query;
    no table function; functions are DuckDB's scalar, aggregate and window
    functions except those about the machine, process or database
    (``duckdb_*``, ``pragma_*``, ``pg_*``, ``current_setting``, ``version``,
    ``getenv``, ``read_*``, ``glob``, ``query``, ``query_table``, ...).
    ``what`` prefixes the message.
    """
    refused = _refusal(query)
    if refused is not None:
        raise QueryError(f"{what}: {REFUSED}: {refused} is not allowed")


# ---- time limits of sandboxed queries

TIMEOUT_ENV = "EPISODELAKE_QUERY_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 300.0  # sandboxed queries of library calls, unless the environment or query_limits() say else
_REPEAT_S = 0.05  # an interrupt that lands before DuckDB starts the query is lost: it is repeated this often


def _seconds(value: Any, what: str) -> float | None:
    """A time limit in seconds (> 0), None for none (None, 0, ``inf``, ``"none"``); else ArgumentError."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "off", "0", "inf")):
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ArgumentError(f"{what} must be a number of seconds (0 or 'none': no limit), got {value!r}") from None
    if isinstance(value, bool) or math.isnan(seconds) or seconds < 0:
        raise ArgumentError(f"{what} must be a number of seconds >= 0 (0: no limit), got {value!r}")
    return None if seconds == 0 or math.isinf(seconds) else seconds


def default_timeout() -> float | None:
    """The time limit of a sandboxed query outside :func:`query_limits`: ``EPISODELAKE_QUERY_TIMEOUT_S``, else 300 s."""
    configured = os.environ.get(TIMEOUT_ENV)
    return DEFAULT_TIMEOUT_S if configured is None else _seconds(configured, TIMEOUT_ENV)


class QueryLimits:
    """The limits of the sandboxed queries run under one :func:`query_limits` block (in its thread).

    ``seconds``: each query's time limit (None: none). :meth:`cancel` (from
    any thread) interrupts the queries running under it now and refuses the
    ones that start later, with ``why`` in their QueryError.
    """

    def __init__(self, seconds: float | None, source: str = "query_limits()") -> None:
        self.seconds, self.source = seconds, source
        self.cancelled: str | None = None
        self._lock = threading.Lock()
        self._running: set[_Run] = set()

    def cancel(self, why: str) -> None:
        with self._lock:
            self.cancelled = why
            running = list(self._running)
        for run in running:
            run.wake.set()

    def _enter(self, run: _Run) -> None:
        with self._lock:
            self._running.add(run)
            if self.cancelled is not None:
                run.wake.set()

    def _leave(self, run: _Run) -> None:
        with self._lock:
            self._running.discard(run)


_LIMITS: ContextVar[QueryLimits | None] = ContextVar("episodelake_query_limits", default=None)


@contextmanager
def query_limits(seconds: Any, source: str = "query_limits()") -> Iterator[QueryLimits]:
    """Within the block (this thread), every sandboxed query has time limit ``seconds`` (0 or None: none).

    Yields the :class:`QueryLimits`, whose ``cancel(why)`` stops the block's
    queries from another thread (the viewer cancels a request's query when its
    client goes away). ``source`` names where the limit was set, in the
    error of a query that hits it. Bad ``seconds``: ArgumentError.
    """
    limits = QueryLimits(_seconds(seconds, "query time limit"), source)
    token = _LIMITS.set(limits)
    try:
        yield limits
    finally:
        _LIMITS.reset(token)


class _Run:
    """One limited query: its connection, whether it ended, and the watcher that interrupts it."""

    def __init__(self, con: duckdb.DuckDBPyConnection, seconds: float | None, limits: QueryLimits | None) -> None:
        self.con, self.seconds, self.limits = con, seconds, limits
        self.wake = threading.Event()  # set when it ends or is cancelled
        self.done = threading.Event()  # set when it ends
        self.lock = threading.Lock()
        self.ended = False
        self.timed_out = False

    def watch(self) -> None:
        """Interrupt the query at its deadline or cancellation, and again until it ends."""
        woke = self.wake.wait(self.seconds)
        with self.lock:
            if self.ended:
                return
            self.timed_out = not woke
        while True:
            with self.lock:
                if self.ended:
                    return
                self.con.interrupt()
            self.done.wait(_REPEAT_S)

    def end(self) -> None:
        with self.lock:
            self.ended = True
        self.done.set()
        self.wake.set()


@contextmanager
def limited(con: duckdb.DuckDBPyConnection, what: str) -> Iterator[None]:
    """Run the block's DuckDB work on ``con`` (a sandboxed query) under the current time limit.

    The limit is the enclosing :func:`query_limits`', else
    :func:`default_timeout`. At the limit (or a cancellation) a watcher
    thread calls ``con.interrupt()``; the block's DuckDB error then becomes a
    QueryError saying the limit was hit (naming it) or why it was cancelled.
    No limit and no cancellation: no thread, the block runs as it is.
    """
    limits = _LIMITS.get()
    seconds = limits.seconds if limits is not None else default_timeout()
    if seconds is None and limits is None:
        yield
        return
    run = _Run(con, seconds, limits)
    if limits is not None:
        limits._enter(run)
    watcher = threading.Thread(target=run.watch, name="episodelake-query-limit", daemon=True)
    watcher.start()
    try:
        yield
    except duckdb.Error as exc:
        if run.timed_out:
            source = limits.source if limits is not None else f"{TIMEOUT_ENV}, default {DEFAULT_TIMEOUT_S:g}"
            raise QueryError(
                f"{what}: the query hit its time limit of {seconds:g} s ({source}) and was cancelled"
            ) from exc
        if limits is not None and limits.cancelled is not None:
            raise QueryError(f"{what}: the query was cancelled: {limits.cancelled}") from exc
        raise
    finally:
        run.end()
        # the watcher is gone before the query's caller goes on: a daemon thread still inside DuckDB's
        # interrupt() when the interpreter finalizes aborts the process ("exception not rethrown")
        watcher.join()
        if limits is not None:
            limits._leave(run)
