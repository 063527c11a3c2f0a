"""Write output folders atomically, and never remove or replace a folder the simulator
did not write itself.

* ``check_output_folder(path)`` is the one up-front check every command that writes a
  folder calls before any work: a file where a folder is expected (or in the path), a
  parent that cannot be written, the current folder, or an existing non-empty folder
  that sim did not write are refused with one line (``OutputPathError``, exit 2).
* ``atomic_folder(path)`` builds the folder under a hidden temporary name
  ``.<name>.XXXX`` beside the target and renames it into place at the end.  Every
  folder it writes carries the marker file ``MARKER`` (JSON: writer, kind, the entries
  it wrote); an existing target is replaced only when it carries that marker and holds
  nothing more than the entries it lists (one line on stderr says so), or when it is an
  empty folder.
* The final step (move an earlier folder aside, rename the new one in, delete the old
  one) runs under an exclusive ``flock`` on the parent folder with SIGINT/SIGTERM held
  back; a signal that arrived meanwhile undoes the step, so an interrupt leaves no
  temporary folder, no partial output, and the earlier folder intact.  Runs that share
  a target land one after the other, each whole; if something that is not a sim folder
  took the target meanwhile, the run says so in one line and writes nothing.

Test hook: ``HCS_TEST_PAUSE_WRITE=<seconds>`` sleeps after the files are written into
the temporary folder and before they are moved into place (tests send signals there).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from sim.config.errors import InputError

MARKER = ".hcs-output"
PAUSE_ENV = "HCS_TEST_PAUSE_WRITE"
_SIGNALS = {signal.SIGINT, signal.SIGTERM}


class OutputPathError(InputError):
    """An output path that may not be used (one line naming the path)."""


def _shown(given: str | Path) -> str:
    """The path as the user gave it, with the absolute one where that is unclear."""
    g = str(given)
    norm = os.path.normpath(g)
    if norm in (".", "..") or norm.startswith("../") or "/../" in g or g.endswith("/.."):
        return f"{g} ({os.path.abspath(g)})"
    return g


def _written_entries(folder: Path) -> set[str] | None:
    """The entries sim wrote in ``folder`` as its marker records them; None when the
    folder carries no (readable) marker, i.e. sim did not write it."""
    m = folder / MARKER
    if m.is_symlink() or not m.is_file():
        return None
    try:
        data = json.loads(m.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("written_by") != "hybrid-cache-sim" \
            or not isinstance(data.get("entries"), list):
        return None
    return {str(e) for e in data["entries"]}


def is_own_folder(folder: str | Path) -> bool:
    """A folder sim wrote and nobody has added anything to since."""
    folder = Path(folder)
    written = _written_entries(folder)
    if written is None:
        return False
    try:
        return not set(os.listdir(folder)) - written - {MARKER}
    except OSError:
        return False


def _marker_kind(folder: Path) -> str | None:
    try:
        return str(json.loads((folder / MARKER).read_text()).get("kind"))
    except (OSError, ValueError, AttributeError):
        return None


def _write_marker(folder: Path, kind: str) -> None:
    entries = sorted(e for e in os.listdir(folder) if e != MARKER)
    with open(folder / MARKER, "w") as f:
        json.dump({"written_by": "hybrid-cache-sim", "kind": kind, "entries": entries}, f)
        f.write("\n")


def _target_state(out: Path, shown: str) -> str:
    """'absent', 'empty' or 'own'; anything else raises OutputPathError."""
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        return "absent"
    except OSError as e:
        raise OutputPathError(f"{shown}: cannot use as output folder: {e.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise OutputPathError(f"{shown}: is a symbolic link; give the folder itself as the output "
                              "folder")
    if not stat.S_ISDIR(st.st_mode):
        raise OutputPathError(f"{shown}: exists and is not a folder; sim writes a folder there "
                              "(choose another output path)")
    try:
        entries = sorted(os.listdir(out))
    except OSError as e:
        raise OutputPathError(f"{shown}: cannot read the existing folder: {e.strerror}") from None
    if not entries:
        return "empty"
    written = _written_entries(out) if MARKER in entries else None
    if written is not None:
        foreign = [e for e in entries if e not in written and e != MARKER]
        if not foreign:
            return "own"
        entries = foreign           # sim wrote the folder, someone added these since
    some = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
    raise OutputPathError(f"{shown}: folder exists and holds files sim did not write ({some}); "
                          "sim only replaces folders it wrote itself: choose a new or empty "
                          "folder")


def _nearest_existing(folder: Path, shown: str) -> tuple[Path, list[Path]]:
    """The nearest existing ancestor (a folder) and the missing folders below it."""
    missing: list[Path] = []
    p = folder
    while True:
        try:
            st = os.stat(p)
        except (FileNotFoundError, NotADirectoryError):
            missing.append(p)
            if p.parent == p:
                raise OutputPathError(f"{shown}: no existing folder above it") from None
            p = p.parent
            continue
        except OSError as e:
            raise OutputPathError(f"{shown}: cannot use {p}: {e.strerror}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise OutputPathError(f"{shown}: {p} is a file, not a folder, so nothing can be "
                                  "written under it")
        return p, list(reversed(missing))


def check_output_folder(path: str | Path) -> str:
    """Up-front check of an output folder, before any work; raises OutputPathError.

    Returns 'absent', 'empty' or 'own' (an earlier folder sim wrote: it will be replaced).
    """
    return _check(Path(os.path.abspath(path)), _shown(path))


def _check(out: Path, shown: str) -> str:
    if out.parent == out:
        raise OutputPathError(f"{shown}: is the filesystem root; choose a new folder")
    try:
        inside = Path.cwd().resolve().is_relative_to(out.resolve())
    except OSError:
        inside = False
    if inside:
        raise OutputPathError(f"{shown}: is the current folder or contains it; choose a new "
                              "folder")
    anchor, _ = _nearest_existing(out.parent, shown)
    state = _target_state(out, shown)
    # Can we create (and rename) entries there?  Root ignores permission bits, so try.
    with _held_signals():
        try:
            probe = tempfile.mkdtemp(prefix=f".{out.name}.", dir=anchor)
            os.rmdir(probe)
        except OSError as e:
            raise OutputPathError(f"{shown}: cannot write in {anchor}: {e.strerror}") from None
    return state


@contextmanager
def _held_signals():
    """Hold SIGINT/SIGTERM back: ``with _held_signals() as caught:`` a signal that
    arrives inside is recorded in ``caught`` and raised on leaving (its own handler
    runs then).  Handlers, not the signal mask, are swapped: a library thread (BLAS,
    a pool's feeder) would take a masked signal and Python would still run the handler
    in the main thread at once.  Outside the main thread nothing is held (handlers
    only ever run in the main thread)."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    old = {}
    try:
        for s in _SIGNALS:
            h = signal.getsignal(s)
            if h is not signal.SIG_IGN and h is not None:
                old[s] = signal.signal(s, lambda signum, frame: caught.append(signum))
        yield caught
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if caught:
            signal.raise_signal(caught[0])      # its own handler runs (and raises) now


@contextmanager
def _parent_lock(parent: Path):
    """Exclusive flock on the parent folder: one commit at a time per parent."""
    try:
        import fcntl
    except ImportError:         # not POSIX: no lock
        yield
        return
    fd = os.open(parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def _commit(tmp: Path, out: Path, shown: str, kind: str) -> None:
    """Rename ``tmp`` to ``out`` (moving an earlier sim folder aside and deleting it)."""
    parent = out.parent
    with _parent_lock(parent):
        rolled_back = False
        with _held_signals() as caught:
            try:
                state = _target_state(out, shown)
            except OutputPathError as e:
                raise OutputPathError(f"{shown}: another run or program took the folder while "
                                      f"this run was working ({str(e).split(': ', 1)[-1]}); "
                                      "nothing written") from None
            aside = None
            if state == "own":
                aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=parent))
                try:
                    os.rename(out, aside)           # replaces the empty placeholder
                except OSError as e:
                    os.rmdir(aside)
                    raise OutputPathError(f"{shown}: cannot move the earlier folder aside "
                                          f"({e.strerror}); nothing written") from None
            try:
                os.rename(tmp, out)                 # absent, or an empty folder: replaced
            except OSError as e:
                if aside is not None:
                    os.rename(aside, out)
                raise OutputPathError(f"{shown}: cannot move the new folder into place "
                                      f"({e.strerror}); nothing written") from None
            if caught:                              # undo: the old folder stays
                os.rename(out, tmp)
                if aside is not None:
                    os.rename(aside, out)
                rolled_back = True
            elif aside is not None:
                old_kind = _marker_kind(aside) or kind
                sys.stderr.write(f"replacing earlier {old_kind} folder {shown.rstrip('/')}/\n")
                sys.stderr.flush()
                shutil.rmtree(aside, ignore_errors=True)
        # leaving the block above raised the held-back interrupt; should its handler not
        # raise, still report that nothing was written
        if rolled_back:
            raise InterruptedError(f"interrupted while writing {shown}; nothing written")


@contextmanager
def atomic_folder(out: str | Path, kind: str = "run"):
    """``with atomic_folder(out) as tmp:`` write into ``tmp``; on success it becomes
    ``out`` (replacing an earlier folder sim wrote), on error or interrupt it is removed
    with any parent folders made for it.  ``kind`` names the folder in messages and in
    the marker (run, sweep, compare)."""
    shown = _shown(out)
    out = Path(os.path.abspath(out))
    _check(out, shown)
    tmp: Path | None = None
    made: list[Path] = []
    try:
        with _held_signals():
            _, made = _nearest_existing(out.parent, shown)
            for d in made:
                os.mkdir(d)
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        os.chmod(tmp, 0o777 & ~_umask())
        yield tmp
        _write_marker(tmp, kind)
        pause = os.environ.get(PAUSE_ENV)
        if pause:
            time.sleep(float(pause))
        _commit(tmp, out, shown, kind)
    except BaseException:
        with _held_signals():
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            for d in reversed(made):
                try:
                    os.rmdir(d)
                except OSError:
                    pass
        raise


def check_output_file(path: str | Path) -> None:
    """Up-front check of an output file (a calibration profile): no folder there, no
    file in the path, a parent that can be written; raises OutputPathError."""
    shown = _shown(path)
    p = Path(os.path.abspath(path))
    anchor, _ = _nearest_existing(p.parent, shown)
    if p.is_dir():
        raise OutputPathError(f"{shown}: is a folder; give a file path")
    with _held_signals():
        try:
            fd, probe = tempfile.mkstemp(prefix=f".{p.name}.", dir=anchor)
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            raise OutputPathError(f"{shown}: cannot write in {anchor}: {e.strerror}") from None


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write a file atomically: a hidden temporary file beside it, then ``os.replace``."""
    path = Path(path)
    check_output_file(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp: str | None = None
    try:
        with _held_signals():
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        with _held_signals():
            os.replace(tmp, path)
            tmp = None
    except BaseException:
        if tmp is not None:
            with _held_signals():
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        raise
