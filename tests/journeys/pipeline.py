"""Run an actor script piped into a learner script, as two real processes, and read the learner's JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).parent / "scripts"


def actor_into_learner(cwd: Path, actor: list[str], learner: list[str], timeout: float) -> dict[str, Any]:
    """Start ``actor`` (script + args) with its stdout piped into ``learner``; both must exit 0.

    Returns the JSON the learner printed. A process still running when the
    other failed or timed out is killed.
    """
    act = subprocess.Popen([sys.executable, str(SCRIPTS / actor[0]), *actor[1:]], cwd=cwd, stdout=subprocess.PIPE)
    learn = subprocess.Popen(
        [sys.executable, str(SCRIPTS / learner[0]), *learner[1:]],
        cwd=cwd,
        stdin=act.stdout,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert act.stdout is not None
    act.stdout.close()  # the learner holds the pipe's only reader
    try:
        out, err = learn.communicate(timeout=timeout)
        assert act.wait(timeout=60) == 0
    finally:
        for proc in (act, learn):
            if proc.poll() is None:
                proc.kill()
    assert learn.returncode == 0, err
    return json.loads(out)
