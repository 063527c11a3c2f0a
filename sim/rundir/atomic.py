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

* A temporary folder carries a writer record (``WRITER``: the writing process's pid,
  start time, boot and host); one left behind by a writer that is gone (SIGKILL, a
  power cut) is swept by the next write into the same parent folder.  Nothing is
  removed without that record, nor while its writer lives (the pid with the same
  start time, on this host and boot); an earlier folder moved aside by a writer that
  died mid-commit is put back when nothing took its place.
* ``staged_files(folder)`` writes files into an existing folder (``sim report``) all
  or nothing: every ``write_file`` inside lands in a hidden temporary folder beside it
  and is moved into place at the end; what sim wrote there joins the folder's marker.
* A disk that is full (or a quota, a file-size limit, a read-only filesystem) while
  writing is one line naming the output and the file (``OutputPathError``), with
  nothing half-written: the temporary files are removed.

Test hook: ``HCS_TEST_PAUSE_WRITE=<seconds>`` sleeps after the files are written into
the temporary folder (or staged) and before they are moved into place (tests send
signals there).
"""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from sim.errors import InputError

MARKER = ".hcs-output"
WRITER = ".hcs-writer"      # in a temporary folder: who is writing it
PAUSE_ENV = "HCS_TEST_PAUSE_WRITE"
_SIGNALS = {signal.SIGINT, signal.SIGTERM}
#: what the environment, not the program, makes a write fail with: one line, not a trace
WRITE_ERRNOS = frozenset(getattr(errno, n) for n in ("ENOSPC", "EDQUOT", "EFBIG", "EROFS",
                                                     "EACCES", "EPERM", "EIO", "ENAMETOOLONG",
                                                     "ELOOP", "EMLINK")
                         if hasattr(errno, n))


class OutputPathError(InputError):
    """An output path that may not be used (one line naming the path)."""


def write_failure(e: BaseException) -> bool:
    """Whether ``e`` is a write the environment made fail (disk full, read-only ...)."""
    return isinstance(e, OSError) and e.errno in WRITE_ERRNOS


def _failed_write(shown: str, e: OSError, root: Path | None, rest: str) -> OutputPathError:
    """The one line of a write that failed: the output, the file (as inside it) and why."""
    name = ""
    if e.filename:
        f = Path(str(e.filename))
        if root is not None:
            try:
                name = f.relative_to(root).as_posix()
            except ValueError:
                name = f.name
        else:
            name = f.name
        m = re.match(r"^(?P<dir>.*/)?\.(?P<name>[^/]+)\.[a-z0-9_]{8}$", name)
        if m:                               # (a file's temporary name: the file's)
            name = (m["dir"] or "") + m["name"]
    what = f"cannot write {name}" if name else "cannot write"
    return OutputPathError(f"{shown}: {what}: {e.strerror or e}; {rest}")


# ---- who writes a temporary folder (so that a stale one can be swept) -----------------

def _proc_start(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks after boot), None where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def _writer_record() -> dict:
    import socket

    pid = os.getpid()
    return {"written_by": "hybrid-cache-sim", "pid": pid, "start": _proc_start(pid),
            "boot": _boot_id(), "host": socket.gethostname()}


def _writer_gone(rec: dict) -> bool:
    """Whether the writer a record names has certainly ended: on this host, and its boot
    is over, or no process has its pid with its start time.  Anything unsure: alive."""
    import socket

    if not isinstance(rec, dict) or rec.get("written_by") != "hybrid-cache-sim":
        return False
    pid, start, boot = rec.get("pid"), rec.get("start"), rec.get("boot")
    if rec.get("host") != socket.gethostname() or not isinstance(pid, int) \
            or not isinstance(start, int) or boot is None:
        return False
    here = _boot_id()
    if here is None:
        return False
    if boot != here:
        return True
    return _pid_gone(pid, start)


def _pid_gone(pid: int, start: int) -> bool:
    """No process has ``pid`` with this start time.  A process this one may not see
    (another user's, under hidepid) counts as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:             # (exists, another user's)
        return False
    now = _proc_start(pid)
    return now is not None and now != start


def _read_writer(folder: Path) -> dict | None:
    p = folder / WRITER
    try:
        if p.is_symlink() or not p.is_file() or p.stat().st_size > 4096:
            return None
        rec = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def _make_temp(parent: Path, prefix: str) -> Path:
    """A new hidden temporary folder in ``parent`` with this process's writer record."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        with open(tmp / WRITER, "w") as f:
            json.dump(_writer_record(), f)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


_ASIDE = re.compile(r"^\.(?P<name>.+)\.old\.(?P<pid>\d+)-(?P<start>\d+)-(?P<boot>[0-9a-f]{8})\.")


def _aside_tag() -> str:
    pid = os.getpid()
    return f"{pid}-{_proc_start(pid) or 0}-{(_boot_id() or '0' * 8).replace('-', '')[:8]}"


def sweep_stale(parent: Path) -> list[str]:
    """Remove the hidden temporary folders in ``parent`` whose writer is gone (see
    ``_writer_gone``); put back an earlier folder a dead writer had moved aside when
    nothing took its place (else remove it, if it is a sim folder no one added to).
    Returns the names removed or restored.  Never raises."""
    done: list[str] = []
    try:
        names = [n for n in os.listdir(parent) if n.startswith(".")]
    except OSError:
        return done
    boot = (_boot_id() or "").replace("-", "")[:8]
    for name in names:
        p = parent / name
        try:
            if p.is_symlink() or not p.is_dir():
                continue
            m = _ASIDE.match(name)
            if m:
                start = int(m["start"])
                if not boot:
                    continue                        # (no way to tell)
                gone = m["boot"] != boot or (start != 0 and _pid_gone(int(m["pid"]), start))
                if not gone or _written_entries(p) is None:
                    continue
                target = parent / m["name"]
                if not os.path.lexists(target):
                    os.rename(p, target)            # the earlier folder, back in place
                elif is_own_folder(p):
                    shutil.rmtree(p)
                else:
                    continue
                done.append(name)
                continue
            rec = _read_writer(p)
            if rec is not None and _writer_gone(rec):
                shutil.rmtree(p)
                done.append(name)
        except OSError:
            continue
    return done


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


_TEMP_FILE = re.compile(r"^\..+\.[a-z0-9_]{8}$")     # (``_replace_file``'s temporary names)


def _write_marker(folder: Path, kind: str) -> None:
    for e in os.listdir(folder):            # (a writer stopped mid-file: its temporary file)
        if _TEMP_FILE.match(e) and os.path.isfile(folder / e) and e not in (MARKER, WRITER):
            os.unlink(folder / e)
    entries = sorted(e for e in os.listdir(folder) if e not in (MARKER, WRITER))
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
    except (OSError, RuntimeError):     # (a symbolic link loop: said below, in one line)
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
                # (named by this process, so that should it die here, the next write in
                # this folder puts the earlier folder back: ``sweep_stale``)
                aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.{_aside_tag()}.",
                                              dir=parent))
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
            if not made:
                sweep_stale(out.parent)     # (what writers that died left here)
            tmp = _make_temp(out.parent, f".{out.name}.")
        os.chmod(tmp, 0o777 & ~_umask())
        yield tmp
        _write_marker(tmp, kind)
        pause = os.environ.get(PAUSE_ENV)
        if pause:
            time.sleep(float(pause))
        os.unlink(tmp / WRITER)         # (the record stays until the folder lands)
        _commit(tmp, out, shown, kind)
    except BaseException as e:
        with _held_signals():
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            for d in reversed(made):
                try:
                    os.rmdir(d)
                except OSError:
                    pass
        if write_failure(e):
            raise _failed_write(shown, e, tmp, "nothing written") from None
        if isinstance(e, OutputPathError) and tmp is not None and str(tmp) in str(e):
            # (a folder written inside this one, e.g. a compare's off/: named in place)
            raise OutputPathError(str(e).replace(str(tmp), shown.rstrip("/"))) from None
        raise
