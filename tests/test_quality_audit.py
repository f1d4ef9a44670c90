"""Quality checks and audits (issue 22): ``el.Check``, stored checks, ``ds.quality.check``, the CLI ``check``.

Every report is compared with a reference computed in NumPy/pure Python from
the episodes the test wrote (never from the dataset): which episodes fail
each check and the first failing step. A NULL predicate result fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import episodelake as el

ROOT = Path(__file__).resolve().parents[1]


def schema() -> el.DatasetSchema:
    return el.DatasetSchema(
        [
            el.FieldSpec("state", (2,), "float32"),
            el.FieldSpec("action", (2,), "float32", role="action"),
            el.FieldSpec("reward", (), "float32", role="reward"),
            el.FieldSpec("success", (), "bool", role="meta"),
            el.FieldSpec("score", (), "float64", role="meta"),  # None in some episodes: NULL in SQL
        ]
    )


def random_episode(rng: np.random.Generator, nan: bool = False) -> dict:
    length = int(rng.integers(1, 12))
    action = rng.uniform(-1.5, 1.5, (length, 2)).astype(np.float32)
    if nan and rng.random() < 0.3:
        action[rng.integers(length), 0] = np.nan
    score = None if rng.random() < 0.25 else float(rng.uniform(-1, 1))
    return {
        "observations": rng.uniform(-1, 1, (length + 1, 2)).astype(np.float32),
        "actions": action,
        "rewards": rng.uniform(-1, 1, length).astype(np.float32),
        "terminated": True,
        "meta": {"success": bool(rng.random() < 0.5), "score": score},
    }


# Predicate templates and their pure-Python references: an episode-level reference says whether the episode
# passes, a step-level one whether step t passes (None: NULL, which fails).
def _episode_success(ep: dict, c: float) -> bool:
    return (not ep["meta"]["success"]) or float(np.sum(ep["rewards"].astype(np.float64))) > c


def _episode_score(ep: dict, c: float) -> bool:
    return ep["meta"]["score"] is not None and ep["meta"]["score"] >= c


def _step_action(ep: dict, t: int, c: float) -> bool:
    return bool(abs(ep["actions"][t, 0]) <= np.float32(c))  # NaN compares False: fails, as in DuckDB


def _step_state(ep: dict, t: int, c: float) -> bool:
    return bool(ep["observations"][t, 1] < np.float32(c))  # row t: where action t was taken


def _step_next_state(ep: dict, t: int, c: float) -> bool:
    return bool(ep["observations"][t + 1, 0] >= np.float32(c))  # row t + 1: what action t produced


TEMPLATES = {
    "success": ("episode", 'NOT success OR "return" > {c}', _episode_success),
    "score": ("episode", "score >= {c}", _episode_score),
    "action": ("step", 'abs("action"[1]) <= {c}', _step_action),
    "state": ("step", '"observation/state"[2] < {c}', _step_state),
    "next_state": ("step", '"next_observation/state"[1] >= {c}', _step_next_state),
}


def make_check(kind: str, c: float, on_fail: str = "reject") -> el.Check:
    level, text, _ = TEMPLATES[kind]
    # float32 constants as DuckDB's FLOAT, so the comparison is the reference's float32 one
    constant = f"{float(np.float32(c))!r}::FLOAT" if level == "step" else repr(c)
    return el.Check(kind, text.format(c=constant), level, on_fail)


def reference(episodes: dict[int, dict], kind: str, c: float) -> tuple[list[int], list[int] | None]:
    """(failing episode ids in id order, first failing step of each or None for an episode check)."""
    level, _, passes = TEMPLATES[kind]
    ids, steps = [], []
    for eid in sorted(episodes):
        ep = episodes[eid]
        if level == "episode":
            if not passes(ep, c):
                ids.append(eid)
            continue
        bad = [t for t in range(len(ep["actions"])) if not passes(ep, t, c)]
        if bad:
            ids.append(eid)
            steps.append(bad[0])
    return ids, (None if level == "episode" else steps)


def written(path: str | None, episodes: list[dict], **options) -> tuple[el.Dataset, dict[int, dict]]:
    ds = el.Dataset.create(schema(), path, commit_episodes=10**6, **options)
    ds.append_episodes(episodes)
    ds.flush()
    return ds, dict(zip(ds.episode_ids.tolist(), episodes, strict=True))


def assert_report(report, episodes: dict[int, dict], expected: list[tuple[str, float]]) -> None:
    assert [r.check.name for r in report] == [k for k, _ in expected]
    assert report.episodes == len(episodes)
    rows = []
    for kind, c in expected:
        ids, steps = reference(episodes, kind, c)
        got = report[kind]
        assert got.episode_ids.tolist() == ids, kind
        assert (None if got.steps is None else got.steps.tolist()) == steps, kind
        assert got.failed == len(ids)
        rows += [(kind, i, None if steps is None else s) for i, s in zip(ids, steps or [None] * len(ids), strict=True)]
    assert report.ok == (not rows)
    table = report.to_arrow()
    assert table.column_names == ["check", "episode_id", "step"]
    assert list(zip(*(table.column(n).to_pylist() for n in table.column_names), strict=True)) == rows


# ---- el.Check


@settings(max_examples=40, deadline=None)
@given(
    name=st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True),
    level=st.sampled_from(["episode", "step"]),
    on_fail=st.sampled_from(["reject", "quarantine", "warn"]),
    c=st.floats(-10, 10),
)
def test_check_round_trips_through_json(name, level, on_fail, c):
    check = el.Check(name, f"score > {c!r}", level, on_fail)
    again = el.Check.from_dict(json.loads(json.dumps(check.to_dict())))
    assert again == check
    assert (again.name, again.predicate, again.level, again.on_fail) == (name, f"score > {c!r}", level, on_fail)


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"name": "", "predicate": "true"}, el.ArgumentError, "simple identifier"),
        ({"name": "1st", "predicate": "true"}, el.ArgumentError, "simple identifier"),
        ({"name": "a b", "predicate": "true"}, el.ArgumentError, "simple identifier"),
        ({"name": "a'b", "predicate": "true"}, el.ArgumentError, "simple identifier"),
        ({"name": "ok", "predicate": "true", "level": "row"}, el.ArgumentError, "level must be one of"),
        ({"name": "ok", "predicate": "true", "on_fail": "drop"}, el.ArgumentError, "on_fail must be one of"),
        ({"name": "ok", "predicate": ""}, el.QueryError, "'ok' needs a SQL predicate"),
        ({"name": "ok", "predicate": "x > 1; DROP TABLE episodes"}, el.QueryError, "'ok': invalid predicate"),
        ({"name": "ok", "predicate": "1) OR (1"}, el.QueryError, "'ok': invalid predicate"),
        ({"name": "ok", "predicate": "score > ?"}, el.QueryError, "'ok': predicate 'score > ?' has placeholders"),
    ],
)
def test_bad_checks_are_refused_naming_the_check(kwargs, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        el.Check(**kwargs)


# ---- audits against the reference


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    count=st.integers(1, 12),
    chosen=st.lists(st.sampled_from(sorted(TEMPLATES)), min_size=1, max_size=5, unique=True),
    constants=st.lists(st.floats(-1.2, 1.2), min_size=5, max_size=5),
    on_disk=st.booleans(),
)
def test_audit_matches_the_reference_on_random_datasets(seed, count, chosen, constants, on_disk):
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, "ds") if on_disk else None
        ds, episodes = written(path, [random_episode(rng, nan=True) for _ in range(count)])
        expected = list(zip(chosen, constants, strict=False))
        checks = [make_check(k, c) for k, c in expected]
        assert_report(ds.quality.check(checks), episodes, expected)
        # stored, the same checks give the same report, also to another handle on the same root
        ds.quality.add(*checks)
        assert ds.quality.list() == tuple(checks)
        assert_report(ds.quality.check(), episodes, expected)
        if path is not None:
            assert_report(el.Dataset.open(path, read_only=True).quality.check(), episodes, expected)


@pytest.mark.parametrize("where", ["memory", "disk", "s3"])
def test_stored_checks_audit_everywhere_and_survive_a_reopen(where, tmp_path, request):
    options, path = {}, {"memory": None, "disk": str(tmp_path / "ds")}.get(where)
    if where == "s3":
        options = {"storage_options": request.getfixturevalue("s3_server").storage_options}
        path = request.getfixturevalue("s3_url")
    rng = np.random.default_rng(7)
    expected = [("success", 0.0), ("action", 1.0), ("next_state", -0.5)]
    checks = [make_check(k, c, on_fail) for (k, c), on_fail in zip(expected, ["warn", "warn", "warn"], strict=True)]
    ds = el.Dataset.create(schema(), path, checks=checks, **options)
    eps = [random_episode(rng) for _ in range(10)]
    ds.append_episodes(eps)
    ds.flush()
    episodes = dict(zip(ds.episode_ids.tolist(), eps, strict=True))
    report = ds.quality.check()
    assert_report(report, episodes, expected)
    assert not report.ok  # the data is drawn so that these constants fail somewhere
    assert "ADD CHECK" in [h["operation"] for h in ds.history()]
    if path is not None:
        again = el.Dataset.open(path, **options)
        assert again.quality.list() == tuple(checks)
        assert_report(again.quality.check(), episodes, expected)


def test_audits_include_quarantined_episodes(tmp_path):
    rng = np.random.default_rng(7)
    eps = [random_episode(rng) for _ in range(10)]
    expected = [("success", 0.0), ("action", 1.0)]
    checks = [make_check("success", 0.0, "quarantine"), make_check("action", 1.0, "warn")]
    ds = el.Dataset.create(schema(), str(tmp_path / "ds"), checks=checks)
    ds.append_episodes(eps)
    ds.flush()
    held = ds.quality.quarantine()
    # one writer numbers its episodes in the order they were appended
    episodes = dict(zip(sorted([*ds.episode_ids.tolist(), *held.episode_ids.tolist()]), eps, strict=True))
    quarantined, _ = reference(episodes, "success", 0.0)
    assert 0 < len(held) < len(eps)
    assert sorted(held.episode_ids.tolist()) == quarantined
    assert_report(ds.quality.check(), episodes, expected)
    kept = {i: e for i, e in episodes.items() if i not in set(quarantined) and e["meta"]["success"]}
    chosen = {i: e for i, e in episodes.items() if e["meta"]["success"]}
    assert len(chosen) > len(kept)  # quarantined episodes match the where= too
    assert_report(ds.quality.check(where="success"), chosen, expected)


def test_where_audits_only_the_matching_episodes():
    rng = np.random.default_rng(3)
    ds, episodes = written(None, [random_episode(rng) for _ in range(12)])
    expected = [("action", 1.0), ("score", 0.0)]
    checks = [make_check(k, c) for k, c in expected]
    chosen = {i: e for i, e in episodes.items() if e["meta"]["success"]}
    assert 0 < len(chosen) < len(episodes)
    assert_report(ds.quality.check(checks, where="success = ?", params=[True]), chosen, expected)
    with pytest.raises(el.ArgumentError, match="params= fills placeholders of where="):
        ds.quality.check(checks, params=[True])


def test_a_null_result_fails_and_the_printed_report_names_failures():
    eps = [random_episode(np.random.default_rng(i)) for i in range(4)]
    for i, ep in enumerate(eps):
        ep["meta"]["score"] = None if i % 2 else 0.5
    ds, episodes = written(None, eps)
    report = ds.quality.check([el.Check("score", "score > 0")])
    nulls = sorted(i for i, e in episodes.items() if e["meta"]["score"] is None)
    assert report["score"].episode_ids.tolist() == nulls
    text = str(report)
    assert "score" in text and f"2/{len(eps)}" in text and str(nulls[0]) in text
    with pytest.raises(el.ValidationError, match="checks failed"):
        report.raise_if_failed()
    passing = ds.quality.check([el.Check("length", "length >= 1")])
    assert passing.ok and passing.failed == []
    passing.raise_if_failed()


# ---- versioning, time travel, refusals


def test_checks_are_versioned_and_time_travel_sees_each_versions_checks(tmp_path):
    path = str(tmp_path / "ds")
    rng = np.random.default_rng(11)
    ds, episodes = written(path, [random_episode(rng) for _ in range(8)])
    v0 = ds.version
    a, b = make_check("success", 0.0), make_check("action", 1.0)
    v1 = ds.quality.add(a)
    v2 = ds.quality.add(b)
    assert v2 == ds.quality.add(b)  # the same check again: no commit
    v3 = ds.quality.drop("success")
    assert v0 < v1 < v2 < v3 == ds.version
    ops = {h["version"]: h["operation"] for h in ds.history()}
    assert (ops[v1], ops[v2], ops[v3]) == ("ADD CHECK", "ADD CHECK", "DROP CHECK")
    seen = {v: el.Dataset.open(path, version=v).quality.list() for v in (v0, v1, v2, v3)}
    assert seen == {v0: (), v1: (a,), v2: (a, b), v3: (b,)}
    old = el.Dataset.open(path, version=v2)
    assert_report(old.quality.check(), episodes, [("success", 0.0), ("action", 1.0)])
    with pytest.raises(el.ArgumentError, match="no checks are stored"):
        el.Dataset.open(path, version=v0).quality.check()
    with pytest.raises(el.ReadOnlyError):
        old.quality.add(make_check("score", 0.0))


def test_bad_predicates_and_names_are_refused_and_change_nothing(tmp_path):
    path = str(tmp_path / "ds")
    ds, _ = written(path, [random_episode(np.random.default_rng(1)) for _ in range(3)])
    ds.quality.add(make_check("success", 0.0))
    before = (ds.version, ds.quality.list(), len(ds.history()))
    refusals = [
        (lambda: ds.quality.add(el.Check("typo", "scroe > 0")), el.QueryError, "Check 'typo'.*scroe"),
        (lambda: ds.quality.add(el.Check("steps_only", '"action"[1] > 0')), el.QueryError, "Check 'steps_only'"),
        (lambda: ds.quality.add(el.Check("files", "(SELECT count(*) FROM read_csv('/etc/passwd')) > 0")),
         el.QueryError, "Check 'files'"),
        (lambda: ds.quality.add(make_check("action", 1.0), el.Check("bad", "nope", "step")), el.QueryError,
         "Check 'bad'"),
        (lambda: ds.quality.add(el.Check("success", "true")), el.ArgumentError, "different check named 'success'"),
        (lambda: ds.quality.add(), el.ArgumentError, "at least one Check"),
        (lambda: ds.quality.add(make_check("score", 0.0), make_check("score", 1.0)), el.ArgumentError, "repeat"),
        (lambda: ds.quality.drop("nope"), el.ArgumentError, "no check named 'nope'"),
        (lambda: ds.quality.check([el.Check("typo", "scroe > 0")]), el.QueryError, "Check 'typo'"),
        (lambda: ds.quality.check([]), el.ArgumentError, "nothing to check"),
    ]  # fmt: skip
    for call, error, words in refusals:
        with pytest.raises(error, match=words):
            call()
        assert (ds.version, ds.quality.list(), len(ds.history())) == before
    reopened = el.Dataset.open(path)
    assert (reopened.version, reopened.quality.list()) == before[:2]


def test_create_with_a_bad_check_creates_nothing(tmp_path):
    path = tmp_path / "ds"
    with pytest.raises(el.QueryError, match="Check 'typo'"):
        el.Dataset.create(schema(), str(path), checks=[make_check("success", 0.0), el.Check("typo", "scroe > 0")])
    assert not path.exists()
    with pytest.raises(el.ArgumentError, match="repeat"):
        el.Dataset.create(schema(), str(path), checks=[make_check("score", 0.0), make_check("score", 1.0)])
    assert not path.exists()


# ---- the command line


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "episodelake.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=300
    )


def test_cli_check_exit_status_and_json_match_the_reference(tmp_path, capsys):
    path = str(tmp_path / "ds")
    rng = np.random.default_rng(5)
    ds, episodes = written(path, [random_episode(rng) for _ in range(8)])
    ds.quality.add(make_check("success", 0.0))
    ids, _ = reference(episodes, "success", 0.0)
    assert ids  # some episode fails
    stored = cli("check", path, "--json")  # a real process: its exit status
    assert stored.returncode == 1, stored.stderr
    got = json.loads(stored.stdout)
    assert got["ok"] is False and got["episodes"] == len(episodes)
    assert [(c["name"], c["episode_ids"], c["steps"]) for c in got["checks"]] == [("success", ids, None)]
    passing = cli("check", path, "--check", "long_enough=length >= 1", "--json")
    assert passing.returncode == 0, passing.stderr
    assert json.loads(passing.stdout)["checks"][0]["failed"] == 0

    from episodelake.cli.main import main

    step_ids, _ = reference(episodes, "action", 1.0)
    assert main(["check", path, "--check", f"action={make_check('action', 1.0).predicate}", "--level", "step"]) == (
        1 if step_ids else 0
    )
    assert f"action  step   reject   {len(step_ids)}/{len(episodes)}" in capsys.readouterr().out
    assert main(["check", path, "--version", str(ds.version - 1)]) == 1  # before the check was stored
    assert "nothing to check" in capsys.readouterr().err
    assert main(["check", path, "--check", "typo=scroe > 0"]) == 1
    assert "Check 'typo'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        main(["check", path, "--check", "no_equals_sign"])
    assert usage.value.code == 2 and "NAME=PREDICATE" in capsys.readouterr().err


# ---- concurrency at the process boundary


ADDER = """
import sys
import episodelake as el
ds = el.Dataset.open(sys.argv[1])
for i in range(int(sys.argv[3])):
    ds.quality.add(el.Check(f"{sys.argv[2]}_{i}", f"length >= {i}"))
"""


@pytest.mark.slow
def test_two_processes_adding_checks_concurrently_both_land(tmp_path):
    path = str(tmp_path / "ds")
    written(path, [random_episode(np.random.default_rng(0)) for _ in range(2)])
    procs = [
        subprocess.Popen([sys.executable, "-c", ADDER, path, who, "6"], cwd=ROOT, stderr=subprocess.PIPE, text=True)
        for who in ("a", "b")
    ]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    names = {c.name for c in el.Dataset.open(path).quality.list()}
    assert names == {f"{w}_{i}" for w in "ab" for i in range(6)}
