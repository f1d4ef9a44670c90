"""Run an actor script piped into a learner script, as two real processes, and read the learner's JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).parent / "scripts"
HANG_S = 900  # a hang guard only: every step waits on the other process's messages, never on time


def actor_into_learner(cwd: Path, actor: list[str], learner: list[str]) -> dict[str, Any]:
    """Start ``actor`` (script + args) with its stdout piped into ``learner``; both must exit 0.

    A second pipe runs the other way, learner to actor (its descriptor in
    ``JOURNEY_ACK_FD``, see ``scripts/pipe.py``), for an actor that waits on
    the learner. Returns the JSON the learner printed. A process still running
    when the other failed is killed.
    """
    ack_read, ack_write = os.pipe()

    def start(script: list[str], fd: int, **kw: Any) -> subprocess.Popen:
        env = dict(os.environ, JOURNEY_ACK_FD=str(fd))
        argv = [sys.executable, str(SCRIPTS / script[0]), *script[1:]]
        return subprocess.Popen(argv, cwd=cwd, env=env, pass_fds=(fd,), **kw)

    act = start(actor, ack_read, stdout=subprocess.PIPE)
    learn = start(learner, ack_write, stdin=act.stdout, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert act.stdout is not None
    act.stdout.close()  # the learner holds the pipe's only reader
    os.close(ack_read)  # each end lives only in its process: one exiting is EOF for the other
    os.close(ack_write)
    try:
        out, err = learn.communicate(timeout=HANG_S)
        assert act.wait(timeout=HANG_S) == 0
    finally:
        for proc in (act, learn):
            if proc.poll() is None:
                proc.kill()
    assert learn.returncode == 0, err
    return json.loads(out)
