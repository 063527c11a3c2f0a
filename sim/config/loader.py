"""The one YAML/JSON loader every input file goes through.

* bytes that are not UTF-8 are refused, naming the file and the line;
* a key given twice in one mapping is refused, naming the file, the line and the key
  (PyYAML's ``safe_load`` and ``json.loads`` silently keep the last one);
* a syntax error names the file and the line;
* only a regular file is read (a FIFO, ``/dev/zero``, a socket or a device would hang or
  never end), and at most ``MAX_INPUT_BYTES`` of it: a larger file is refused before a
  byte of it is parsed;
* YAML aliases (``*name``) may repeat what their anchor names, but not grow the document
  by more than ``MAX_ALIAS_NODES`` values (a "billion laughs" would fill the memory), and
  an alias may not refer to a value that holds it (a recursive structure);
* ``field_lines`` says where each field path is written, so a message about a field
  can point at its line.

Every error is raised as the caller's ``InputError`` subclass (one message argument).
"""
from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from sim.errors import InputError

_MERGE = "tag:yaml.org,2002:merge"

#: the largest input file read whole (scenario, case, sweep, profile, golden, a run
#: folder's JSON): PyYAML parses ~0.25 MB a second and holds ~90 bytes a byte, so a
#: larger configuration would take minutes and gigabytes before its first error
MAX_INPUT_BYTES = 8 * 2**20
#: how many values YAML aliases may add to a document by repeating their anchors
MAX_ALIAS_NODES = 100_000


def _show(value: Any, limit: int = 60, quote: bool = True) -> str:
    """A value in a message: a short prefix (``sim.config.fields.show``)."""
    from sim.config.fields import show

    if quote:
        return show(value, limit)
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n:,} bytes"


def file_kind(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def open_input(path: str | Path, error: type[InputError] = InputError, text: bool = False,
               newline: str | None = None):
    """Open an input file for reading: only a regular file (a symbolic link to one is
    fine).  A FIFO, a device (``/dev/zero``), a socket or a folder is refused with one
    ``error`` naming it, without blocking (a FIFO is opened non-blocking and never
    read).  ``text``: a UTF-8 text file object (``newline`` as ``open``'s)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise error(f"{path}: cannot read: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        if stat.S_ISDIR(st.st_mode):
            raise error(f"{path}: is a folder, not a file")
        raise error(f"{path}: is {file_kind(st.st_mode)}, not a regular file: sim reads "
                    "input from files only")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise error(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)                # (what was opened, should the path have changed)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{path}: is {file_kind(st.st_mode)}, not a regular file: sim reads "
                        "input from files only")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        if text:
            return open(fd, "r", encoding="utf-8", newline=newline)
        return open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | Path, error: type[InputError] = InputError,
               limit: int = MAX_INPUT_BYTES) -> bytes:
    """A whole input file's bytes: a regular file of at most ``limit`` bytes, else one
    ``error`` naming it (nothing of a larger file is parsed)."""
    with open_input(path, error) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise error(f"{path}: {_size(size)}, larger than the {_size(limit)} an input "
                        "file may hold: not read")
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise error(f"{path}: cannot read: {e.strerror or e}") from None
    if len(data) > limit:       # (grew since it was measured)
        raise error(f"{path}: larger than the {_size(limit)} an input file may hold: not read")
    return data


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, line: int, first: int):
        super().__init__(f"duplicate key {_show(key)} (first given on line {first})")
        self.key = key
        self.line = line
        self.first = first


class _AliasError(yaml.YAMLError):
    """YAML aliases that would expand beyond ``MAX_ALIAS_NODES`` values, or recurse."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line
        self.message = message


def _check_aliases(root) -> None:
    """Refuse a composed document whose aliases would repeat more than
    ``MAX_ALIAS_NODES`` values, or refer to a value holding them.  An alias is the very
    node of its anchor, so the count (memoized by node) costs one visit a node, however
    large the expansion."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def children(node) -> list:
        if isinstance(node, yaml.SequenceNode):
            return list(node.value)
        if isinstance(node, yaml.MappingNode):
            return [n for pair in node.value for n in pair]
        return []

    def size(node) -> int:
        key = id(node)
        got = sizes.get(key)
        if got is not None:
            return got
        if key in active:
            raise _AliasError(node.start_mark.line + 1, "an alias refers to a value that "
                              "holds it (a recursive structure), which sim cannot read")
        active.add(key)
        total = 1 + sum(size(c) for c in children(node))
        active.discard(key)
        sizes[key] = total
        return total

    total = size(root)
    if total - len(sizes) <= MAX_ALIAS_NODES:
        return
    # where: down the fields holding the largest value while it alone is too large
    # (not into a list: an alias's item is its anchor's node, written elsewhere)
    node, line = root, root.start_mark.line + 1
    while isinstance(node, yaml.MappingNode) and node.value:
        at, biggest = max(node.value, key=lambda kv: sizes[id(kv[1])])
        if sizes[id(biggest)] <= MAX_ALIAS_NODES:
            break
        line = at.start_mark.line + 1
        node = biggest
    raise _AliasError(line, f"YAML aliases here expand to {total:,} values, more than "
                      f"{MAX_ALIAS_NODES:,} beyond the {len(sizes):,} written (an alias "
                      "bomb, a 'billion laughs'): refused")


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping, and aliases
    that expand too far or recurse (``_check_aliases``)."""

    def compose_document(self):
        node = super().compose_document()
        if node is not None:
            _check_aliases(node)
        return node

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    hash(key)
                except TypeError:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        "found an unhashable key", key_node.start_mark) from None
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise _DuplicateKey(key, line, seen[key])
                seen[key] = line
        return super().construct_mapping(node, deep)


def decode(data: bytes, source: str, error: type[InputError] = InputError) -> str:
    """UTF-8 bytes → text (a leading BOM dropped); other bytes name file and line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise error(f"{source}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x} at column "
                    f"{col})") from None
    return text[1:] if text.startswith("\ufeff") else text


def decode_line(data: bytes, source: str, lineno: int,
                error: type[InputError] = InputError) -> str:
    """One line of a trace → text; bytes that are not UTF-8 name ``source:lineno``."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{source}:{lineno}: not UTF-8 text (byte 0x{data[e.start]:02x} at column "
                    f"{e.start + 1})") from None


def read_text(path: str | Path, error: type[InputError] = InputError,
              limit: int = MAX_INPUT_BYTES) -> str:
    """A whole input file as text: a regular file of at most ``limit`` bytes
    (``read_bytes``); cannot-read and non-UTF-8 name the file."""
    return decode(read_bytes(path, error, limit), str(path), error)


def _yaml_error(e: yaml.YAMLError, source: str, text: str) -> str:
    if isinstance(e, _AliasError):
        return f"{source}:{e.line}: {e.message}"
    if isinstance(e, _DuplicateKey):
        return f"{source}:{e.line}: duplicate key {_show(e.key)} (first given on line {e.first})"
    if isinstance(e, yaml.reader.ReaderError):
        line = text.count("\n", 0, e.position) + 1
        ch = e.character
        code = ch if isinstance(ch, int) else ord(ch)
        return f"{source}:{line}: not valid YAML: character {code:#x} is not allowed"
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = f"{source}:{mark.line + 1}" if mark is not None else source
    problem = getattr(e, "problem", None) or str(e)
    context = getattr(e, "context", None)
    what = f"{context}: {problem}" if context and problem and context not in problem else problem
    return f"{where}: not valid YAML: {what}"


def loads_yaml(text: str, source: str, error: type[InputError] = InputError) -> Any:
    """Parse one YAML document (JSON is YAML too) with duplicate keys refused."""
    try:
        return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise error(_yaml_error(e, source, text)) from None
    except RecursionError:
        raise error(f"{source}: not valid YAML: nested too deeply") from None


def _no_duplicates(text: str, source: str, error: type[InputError]):
    def hook(pairs: list[tuple[str, Any]]) -> dict:
        out: dict = {}
        for k, v in pairs:
            if k in out:
                # best effort: the line of the key's second appearance in the text
                hits = [m.start() for m in re.finditer(re.escape(json.dumps(k)) + r"\s*:", text)]
                where = f"{source}:{text.count(chr(10), 0, hits[1]) + 1}" if len(hits) > 1 \
                    else source
                raise error(f"{where}: duplicate key {_show(k)}")
            out[k] = v
        return out
    return hook


def loads_json(text: str, source: str, error: type[InputError] = InputError) -> Any:
    """Parse JSON with duplicate keys refused; NaN/Infinity are not JSON and are refused."""
    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    try:
        return json.loads(text, object_pairs_hook=_no_duplicates(text, source, error),
                          parse_constant=no_constant)
    except json.JSONDecodeError as e:
        raise error(f"{source}:{e.lineno}: not valid JSON: {e.msg} (column {e.colno})") from None
    except ValueError as e:
        if isinstance(e, InputError):
            raise
        raise error(f"{source}: not valid JSON: {e}") from None
    except RecursionError:
        raise error(f"{source}: not valid JSON: nested too deeply") from None


def load_file(path: str | Path, error: type[InputError] = InputError,
              fmt: str | None = None) -> Any:
    """Read and parse a YAML or JSON file (JSON when ``fmt == "json"`` or the name ends
    in ``.json``); every problem is one ``error`` naming the file (and line)."""
    text = read_text(path, error)
    if fmt == "json" or (fmt is None and Path(path).suffix.lower() == ".json"):
        return loads_json(text, str(path), error)
    return loads_yaml(text, str(path), error)


def field_lines(text: str) -> dict[str, int]:
    """Dotted field path (``scheduler.max_num_seqs``) → 1-based line where it is written,
    for the mappings of a YAML document (best effort: empty on any error)."""
    out: dict[str, int] = {}
    try:
        node = yaml.compose(text, Loader=StrictLoader)   # (no alias bomb)
    except (yaml.YAMLError, RecursionError):
        return out

    def walk(n, prefix: str, depth: int) -> None:
        if depth > 20 or not isinstance(n, yaml.MappingNode):
            return
        for k, v in n.value:
            if isinstance(k, yaml.ScalarNode):
                path = prefix + str(k.value)
                out.setdefault(path, k.start_mark.line + 1)
                walk(v, path + ".", depth + 1)

    walk(node, "", 0)
    return out


def parse_set(item: str, error: type[InputError] = InputError) -> tuple[str, Any]:
    """``--set FIELD.PATH=VALUE`` → (path, value parsed as YAML)."""
    if "=" not in item:
        raise error(f"--set {_show(item)}: expected FIELD.PATH=VALUE")
    k, v = item.split("=", 1)
    k = k.strip()
    if not k:
        raise error(f"--set {_show(item)}: the field path before '=' is empty "
                    f"(e.g. --set scheduler.max_num_seqs=64)")
    parts = k.split(".")
    if any(not p.strip() for p in parts):
        raise error(f"--set {_show(item)}: field path {_show(k)} has an empty part "
                    f"(write dotted names like cache.hash_block_size)")
    if any(p != p.strip() for p in parts):
        raise error(f"--set {_show(item)}: field path {_show(k)} has spaces around a name")
    try:
        value = yaml.load(v, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except (yaml.YAMLError, RecursionError) as e:
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise error(f"--set {_show(k, 80, False)}: value {_show(v)} is not valid YAML "
                    f"({_show(problem, 300, False)})") from None
    return k, value
