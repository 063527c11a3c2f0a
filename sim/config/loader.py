"""The one YAML/JSON loader every input file goes through.

* bytes that are not UTF-8 are refused, naming the file and the line;
* a key given twice in one mapping is refused, naming the file, the line and the key
  (PyYAML's ``safe_load`` and ``json.loads`` silently keep the last one);
* a syntax error names the file and the line;
* ``load_file(..., lines=True)`` also returns where each field path is written, so a
  message about a field can point at its line.

Every error is raised as the caller's ``InputError`` subclass (one message argument).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from sim.config.errors import InputError

_MERGE = "tag:yaml.org,2002:merge"


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, line: int, first: int):
        super().__init__(f"duplicate key {key!r} (first given on line {first})")
        self.key = key
        self.line = line
        self.first = first


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping."""

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


def read_text(path: str | Path, error: type[InputError] = InputError) -> str:
    """A whole input file as text: cannot-read and non-UTF-8 name the file."""
    try:
        data = Path(path).read_bytes()
    except IsADirectoryError:
        raise error(f"{path}: is a folder, not a file") from None
    except OSError as e:
        raise error(f"{path}: cannot read: {e.strerror or e}") from None
    return decode(data, str(path), error)


def _yaml_error(e: yaml.YAMLError, source: str, text: str) -> str:
    if isinstance(e, _DuplicateKey):
        return f"{source}:{e.line}: duplicate key {e.key!r} (first given on line {e.first})"
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
                raise error(f"{where}: duplicate key {k!r}")
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
        node = yaml.compose(text, Loader=yaml.SafeLoader)
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
        raise error(f"--set {item!r}: expected FIELD.PATH=VALUE")
    k, v = item.split("=", 1)
    k = k.strip()
    if not k:
        raise error(f"--set {item!r}: the field path before '=' is empty "
                    f"(e.g. --set scheduler.max_num_seqs=64)")
    parts = k.split(".")
    if any(not p.strip() for p in parts):
        raise error(f"--set {item!r}: field path {k!r} has an empty part "
                    f"(write dotted names like cache.hash_block_size)")
    if any(p != p.strip() for p in parts):
        raise error(f"--set {item!r}: field path {k!r} has spaces around a name")
    try:
        value = yaml.load(v, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except (yaml.YAMLError, RecursionError) as e:
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise error(f"--set {k}: value {v!r} is not valid YAML ({problem})") from None
    return k, value
