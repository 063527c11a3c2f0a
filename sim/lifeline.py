"""Child processes that die with their parent, whatever ends it.

A worker forked by ``sim sweep`` (its process pool) or by ``sim run`` (the report
workers) must not outlive the command: a parent stopped by SIGKILL runs no ``finally``,
and a worker blocked on a queue that other workers also hold never sees its end.  Two
independent ways, both set up in the child:

* ``die_with_parent(pid)``: Linux's ``PR_SET_PDEATHSIG``, so the kernel sends the child
  SIGKILL the moment its parent ends (and the child ends at once should the parent be
  gone already);
* ``Lifeline``: a pipe whose write end only the parent holds; a thread in the child
  waits on the read end and ends the child when it reads end-of-file, i.e. when the
  parent has ended (or closed the line).  It also covers what the parent-death signal
  does not (the signal follows the thread that forked the child, not the process).
"""
from __future__ import annotations

import os
import signal
import sys
import threading

PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when ``parent`` ends (Linux; elsewhere
    nothing), and end now if it has ended already."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass                        # (the lifeline still watches)
    if os.getppid() != parent:          # (it ended before the line above)
        os._exit(1)


class Lifeline:
    """``line = Lifeline()`` in the parent before forking; ``line.hold()`` first thing
    in each forked child; ``line.close()`` in the parent once the children are gone."""

    def __init__(self) -> None:
        self.parent = os.getpid()
        self._r, self._w = os.pipe()      # (not inherited by exec'd programs: CLOEXEC)

    def hold(self) -> None:
        """In a forked child: close this copy of the write end, die with the parent
        (``die_with_parent``) and watch the read end for the parent's end."""
        try:
            os.close(self._w)
        except OSError:
            pass
        die_with_parent(self.parent)
        threading.Thread(target=self._watch, name="lifeline", daemon=True).start()

    def _watch(self) -> None:
        try:
            while os.read(self._r, 1):
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGKILL)   # the parent is gone: end, now

    def close(self) -> None:
        for fd in (self._w, self._r):
            try:
                os.close(fd)
            except OSError:
                pass
