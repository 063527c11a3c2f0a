"""Whole files written all or nothing, into folders sim writes (``sim/rundir/atomic.py``
keeps the folders): ``atomic_write_text``, ``write_file`` (inside ``staged_files``: a
batch that lands at once, as ``sim report`` writes its figures), ``read_back``,
``remove_file``, ``file_exists``; ``check_output_file`` refuses a path sim may not write.
A full disk (or quota, file-size limit, read-only filesystem) is one line and nothing
half-written, as for folders."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from sim.rundir.atomic import (MARKER, OutputPathError, PAUSE_ENV, _failed_write,
                               _held_signals, _make_temp, _nearest_existing, _shown, _umask,
                               _written_entries, sweep_stale, write_failure)


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
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _replace_file(path, text.encode("utf-8"))
    except OSError as e:
        if write_failure(e):
            raise _failed_write(_shown(path), e, None, "the file is as it was") from None
        raise


def _replace_file(path: Path, data: bytes) -> None:
    """``path`` now holds ``data``, or (on any error) is as it was: a hidden temporary
    file beside it, then ``os.replace``; the temporary file never stays."""
    tmp: str | None = None
    try:
        with _held_signals():
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        except OSError as e:
            if e.filename is None:       # (a write's error names no file: this one)
                raise OSError(e.errno, e.strerror, str(path)) from None
            raise
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


# ---- files written into an existing folder, all or nothing (``sim report``) ----------

class _Stage:
    """The files written into ``folder`` while ``staged_files`` runs: each in the
    temporary folder ``tmp`` (same relative path) until ``commit``."""

    def __init__(self, folder: Path, tmp: Path):
        self.folder = folder
        self.tmp = tmp
        self.written: dict[str, Path] = {}      # relative path -> its staged file
        self.removed: set[str] = set()

    def rel(self, path: str | Path) -> str | None:
        p = Path(os.path.abspath(path))
        try:
            rel = p.relative_to(self.folder)
        except ValueError:
            return None
        return rel.as_posix() if rel.parts else None


_stage: _Stage | None = None


def write_file(path: str | Path, data: bytes | str) -> None:
    """Write an output file: inside ``staged_files`` into its stage (moved into place
    with the others at the end), else atomically (a temporary file, then a rename):
    never half a file."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    rel = _stage.rel(path) if _stage is not None else None
    if rel is None:
        _replace_file(Path(path), data)
        return
    staged = _stage.tmp / "files" / rel
    staged.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(staged, "wb") as f:
            f.write(data)
    except OSError as e:
        if e.filename is None:           # (a write's error names no file: this one)
            raise OSError(e.errno, e.strerror, str(staged)) from None
        raise
    _stage.written[rel] = staged
    _stage.removed.discard(rel)


def remove_file(path: str | Path) -> None:
    """Remove an output file (an earlier report's figure that no longer belongs): inside
    ``staged_files`` at the end, with the rest; else now."""
    rel = _stage.rel(path) if _stage is not None else None
    if rel is None:
        Path(path).unlink(missing_ok=True)
        return
    _stage.written.pop(rel, None)
    _stage.removed.add(rel)


def file_exists(path: str | Path) -> bool:
    """Whether an output file exists, as ``staged_files`` will leave it."""
    rel = _stage.rel(path) if _stage is not None else None
    if rel is not None:
        if rel in _stage.written:
            return True
        if rel in _stage.removed:
            return False
    return Path(path).exists()


def read_back(path: str | Path) -> bytes:
    """An output file's bytes as written (inside ``staged_files``: its staged copy)."""
    rel = _stage.rel(path) if _stage is not None else None
    if rel is not None and rel in _stage.written:
        return _stage.written[rel].read_bytes()
    return Path(path).read_bytes()


@contextmanager
def staged_files(folder: str | Path):
    """``with staged_files(folder):`` every ``write_file`` / ``remove_file`` under
    ``folder`` lands at the end, all together, or (on an error, a full disk, an
    interrupt) not at all: the folder is then as it was.  Refused up front with one
    line: a folder that cannot be written (read-only, no permission).  The files sim
    writes there join the folder's marker (a run folder stays sim's to replace)."""
    global _stage
    shown = _shown(folder)
    folder = Path(os.path.abspath(folder))
    probe_in(folder, shown)
    try:
        same_device = os.stat(folder).st_dev == os.stat(folder.parent).st_dev
    except OSError as e:
        raise OutputPathError(f"{shown}: cannot use: {e.strerror}") from None
    if not same_device:
        raise OutputPathError(f"{shown}: is a mount point: sim writes its files beside it "
                              "first, then moves them in; give a folder inside it")
    sweep_stale(folder.parent)
    try:
        tmp = _make_temp(folder.parent, f".{folder.name}.")
    except OSError as e:
        raise OutputPathError(f"{shown}: cannot write beside it in {folder.parent}: "
                              f"{e.strerror}; nothing written") from None
    stage = _Stage(folder, tmp)
    outer, _stage = _stage, stage
    try:
        try:
            yield stage
        finally:
            _stage = outer
        pause = os.environ.get(PAUSE_ENV)
        if pause:
            time.sleep(float(pause))
        with _held_signals():
            _land(stage)
    except BaseException as e:
        with _held_signals():
            shutil.rmtree(tmp, ignore_errors=True)
        if write_failure(e):
            raise _failed_write(shown, e, tmp / "files",
                                "nothing written (the folder is as it was)") from None
        raise
    shutil.rmtree(tmp, ignore_errors=True)


def probe_in(folder: Path, shown: str) -> None:
    """Refuse a folder sim cannot create files in (one line, ``OutputPathError``)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".hcs-probe.", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise OutputPathError(f"{shown}: cannot write in it: {e.strerror}; nothing "
                              "written") from None


def _land(stage: _Stage) -> None:
    """Move the staged files into place (a failure on the way puts back what was moved,
    from copies kept aside), remove what was removed, and list in the marker what sim
    wrote."""
    folder = stage.folder
    keep = stage.tmp / "kept"
    moved: list[tuple[Path, Path | None]] = []     # (target, the earlier file kept aside)
    try:
        for rel, staged in sorted(stage.written.items()):
            target = folder / rel
            earlier = None
            if os.path.lexists(target):         # (kept by a second name, to put back)
                earlier = keep / rel
                earlier.parent.mkdir(parents=True, exist_ok=True)
                os.link(target, earlier, follow_symlinks=False)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(staged, 0o666 & ~_umask())
            os.replace(staged, target)
            moved.append((target, earlier))
        _mark_written(folder, {rel.split("/")[0] for rel in stage.written})
    except BaseException:
        for target, earlier in reversed(moved):
            try:
                if earlier is not None:
                    os.replace(earlier, target)
                else:
                    os.unlink(target)
            except OSError:
                pass
        raise
    for rel in sorted(stage.removed):
        try:
            (folder / rel).unlink()
        except FileNotFoundError:
            pass


def _mark_written(folder: Path, names: set[str]) -> None:
    """Add ``names`` (entries sim wrote into ``folder``) to its marker, when it has one."""
    written = _written_entries(folder)
    if written is None or not names - written:
        return
    data = json.loads((folder / MARKER).read_text())
    data["entries"] = sorted(written | names)
    _replace_file(folder / MARKER, (json.dumps(data) + "\n").encode("utf-8"))
