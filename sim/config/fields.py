"""Type checks for configuration sections, read off the dataclass annotations, so a
section is never constructed from a value of the wrong type (``max_num_seqs: lots``)
and no number is NaN or infinite.  Errors are ``ConfigError(field path, problem)``."""
from __future__ import annotations

import math
import re
from dataclasses import fields
from typing import Any

from sim.errors import ConfigError

_YAML11_NUMBER = re.compile(r"^[-+]?(\d[\d_]*)?\.?\d*([eE][-+]?\d+)?$")


def _short_repr(limit: int):
    import reprlib

    r = reprlib.Repr()
    r.maxlevel = 3
    r.maxstring = r.maxlong = r.maxother = limit + 8
    r.maxlist = r.maxtuple = r.maxset = r.maxfrozenset = r.maxdict = r.maxdeque = 8
    r.maxarray = 8
    return r


def show(value: Any, limit: int = 60) -> str:
    """A short one-line repr of a value for a message: at most ``limit`` characters, and
    built without ever writing out a large value whole (a long string, a deep or wide
    structure: ``reprlib``), whatever it holds."""
    text = " ".join(_short_repr(limit).repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# bidirectional-text controls: invisible, they reorder what a terminal or an editor shows
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def control_char(text: str, allow: str = "") -> tuple[int, str] | None:
    """The first control character of ``text`` (C0/C1 controls, DEL, line and paragraph
    separators, bidirectional controls) as (0-based index, character); None if none.
    ``allow``: characters that are fine here (a description's newlines)."""
    if text.isprintable() and not _BIDI.intersection(text):
        return None
    import unicodedata

    for i, ch in enumerate(text):
        if ch not in allow and (ch in _BIDI or unicodedata.category(ch) in ("Cc", "Zl", "Zp")):
            return i, ch
    return None


def control_problem(text: str, allow: str = "") -> str | None:
    """Why a name may not hold ``text`` (a control character in it), or None."""
    got = control_char(text, allow)
    if got is None:
        return None
    i, ch = got
    return (f"holds a control character ({ch!r} at character {i + 1}), which would be "
            "written raw into folder names, CSV files, reports and messages: use printable "
            "characters")


def _kinds(annotation: Any) -> set[str]:
    """``int | None`` (string or type) → {"int", "None"}; unknown parts are kept by name."""
    if isinstance(annotation, type):
        return {annotation.__name__}
    text = str(annotation).replace("typing.", "").replace("NoneType", "None")
    m = re.fullmatch(r"Optional\[(.*)\]", text)
    if m:
        text = m.group(1) + " | None"
    return {p.strip() for p in text.split("|")}


def _number_hint(value: str, want_int: bool) -> str:
    """``'1e6'`` (YAML 1.1 reads it as text) → a spelling YAML reads as a number."""
    if (not _YAML11_NUMBER.match(value.strip()) or not any(c.isdigit() for c in value)
            or not any(c in "eE" for c in value)):
        return ""         # only exponent forms (1e6) are numbers YAML 1.1 leaves as text
    try:
        f = float(value.replace("_", ""))
    except ValueError:
        return ""
    if not math.isfinite(f):
        return ""
    if f.is_integer() and abs(f) < 2**63:
        good = str(int(f))
    elif want_int:
        return f" (a string: YAML reads {value} as text)"
    else:
        good = repr(f)
        mant, _, exp = good.partition("e")
        if exp:
            good = (mant if "." in mant else mant + ".0") + "e" + (exp if exp[0] in "+-" else "+" + exp)
    return f" (a string: YAML reads {value} as text; write {good})"


def type_problem(value: Any, kinds: set[str]) -> str | None:
    """Why ``value`` does not fit a field of these kinds, or None when it does."""
    if value is None:
        return None if "None" in kinds else "must be set (null is not allowed)"
    if "bool" in kinds and isinstance(value, bool):
        return None
    if "int" in kinds and isinstance(value, int) and not isinstance(value, bool):
        return None
    if "float" in kinds and isinstance(value, (int, float)) and not isinstance(value, bool):
        if math.isfinite(value):
            return None
        return f"must be a finite number, got {value}"
    if "str" in kinds and isinstance(value, str):
        return None
    known = {"bool", "int", "float", "str", "None"}
    if kinds - known:
        return None          # a type this check does not know: the section's own validate
    wants = []
    if "int" in kinds and "float" not in kinds:
        wants.append("an integer")
    if "float" in kinds:
        wants.append("a number")
    if "bool" in kinds:
        wants.append("true or false")
    if "str" in kinds:
        wants.append("a string")
    if "None" in kinds:
        wants.append("null")
    hint = ""
    if isinstance(value, str) and ("int" in kinds or "float" in kinds):
        hint = _number_hint(value, "float" not in kinds)
    return f"must be {' or '.join(wants)}, got {show(value)}{hint}"


def check_type(name: str, value: Any, annotation: Any) -> None:
    problem = type_problem(value, _kinds(annotation))
    if problem:
        raise ConfigError(name, problem)


def build_section(cls, data: Any, prefix: str, aliases: dict | None = None,
                  types: dict[str, str] | None = None):
    """A (frozen) dataclass from a mapping: unknown keys, and values whose type does not
    match the field's annotation, are a ``ConfigError`` naming ``prefix + key``.

    ``types`` gives the annotations by hand where the class cannot (a compiled class
    reports ``int | None`` as ``type``)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(prefix.rstrip("."), f"expected a mapping of fields, got {show(data)}")
    types = {f.name: (types or {}).get(f.name, f.type) for f in fields(cls) if f.init}
    kw = {}
    for k, v in data.items():
        if not isinstance(k, str):
            raise ConfigError(prefix + str(k), f"field names are strings, got {show(k)} "
                              f"(known: {', '.join(sorted(types))})")
        name = (aliases or {}).get(k, k)
        if name not in types:
            raise ConfigError(prefix + k, f"unknown key (known: {', '.join(sorted(types))})")
        check_type(prefix + k, v, types[name])
        if name in kw:
            raise ConfigError(prefix + k, f"set twice ({prefix}{name} under another name)")
        kw[name] = v
    return cls(**kw)


def field_kinds(cls, name: str) -> set[str] | None:
    """The kinds of a dataclass field (None when there is no such field)."""
    for f in fields(cls):
        if f.name == name:
            return _kinds(f.type)
    return None


def check_int(prefix: str, name: str, v: Any, lo: int = 0, allow_none: bool = False) -> None:
    """``prefix + name`` must be an integer >= ``lo`` (or None when allowed)."""
    if v is None and allow_none:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        hint = _number_hint(v, True) if isinstance(v, str) else ""
        raise ConfigError(prefix + name, f"must be an integer >= {lo}, got {show(v)}{hint}")


def check_num(prefix: str, name: str, v: Any, lo: float = 0.0, hi: float | None = None,
              allow_none: bool = False) -> None:
    """``prefix + name`` must be a finite number in [lo, hi] (or None when allowed)."""
    if v is None and allow_none:
        return
    if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < lo
            or (hi is not None and v > hi)):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        hint = _number_hint(v, False) if isinstance(v, str) else ""
        raise ConfigError(prefix + name, f"must be a finite number {rng}, got {show(v)}{hint}")
