"""Line messages between journey processes: read without blocking, and the learner's acknowledgement pipe.

``Lines`` reads a pipe's raw file descriptor (not ``sys.stdin``'s buffer, where a
line could sit unseen by ``select``) and hands out one complete line per call.
``ack_pipe`` opens the descriptor ``pipeline.actor_into_learner`` passed in
``JOURNEY_ACK_FD``: the learner writes to it, the actor blocks reading it, so an
actor can wait until the learner has reached a point (an event, not a delay).
"""

from __future__ import annotations

import os
import select
from typing import IO


class Lines:
    """Complete lines of the pipe at ``fd``, one per :meth:`next` call, in order."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buffer, self.eof = fd, b"", False

    def next(self, block: bool) -> str | None:
        """The next line (without its newline); None if none is complete yet (``block=False``) or at EOF."""
        while b"\n" not in self.buffer and not self.eof:
            # a short wait while nothing came: the caller does its own work between calls
            if not select.select([self.fd], [], [], None if block else 0.01)[0]:
                return None
            data = os.read(self.fd, 1 << 16)
            self.eof = not data
            self.buffer += data
        if b"\n" not in self.buffer:
            return None
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()


def ack_pipe(mode: str) -> IO[str]:
    """The acknowledgement pipe's end for this process (``"w"``: the learner, ``"r"``: the actor)."""
    return os.fdopen(int(os.environ["JOURNEY_ACK_FD"]), mode, buffering=1)
