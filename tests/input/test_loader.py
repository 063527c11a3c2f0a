"""The one YAML/JSON loader: duplicate keys, non-UTF-8 bytes, syntax errors and field lines."""
from __future__ import annotations

import pytest

from sim.errors import InputError
from sim.config.loader import field_lines, load_file, loads_yaml, parse_set


def test_duplicate_key_names_file_line_and_key():
    with pytest.raises(InputError, match=r"^f\.yaml:3: duplicate key 'b' \(first given on line 2\)"):
        loads_yaml("a:\n  b: 1\n  b: 2\n", "f.yaml")


def test_merge_keys_are_not_duplicates():
    data = loads_yaml("x: &x {p: 1, q: 2}\ny: {<<: *x, p: 3}\n", "f.yaml")
    assert data["y"] == {"p": 3, "q": 2}


def test_non_utf8_names_the_line(tmp_path):
    p = tmp_path / "f.yaml"
    p.write_bytes(b"a: 1\nb: \xff\n")
    with pytest.raises(InputError, match=r"f\.yaml:2: not UTF-8 text \(byte 0xff"):
        load_file(p)


def test_bom_is_dropped(tmp_path):
    p = tmp_path / "f.yaml"
    p.write_bytes(b"\xef\xbb\xbfa: 1\n")
    assert load_file(p) == {"a": 1}


def test_json_duplicates_and_nan_are_refused(tmp_path):
    p = tmp_path / "f.json"
    p.write_text('{"a": 1,\n "a": 2}')
    with pytest.raises(InputError, match=r"f\.json:2: duplicate key 'a'"):
        load_file(p)
    p.write_text('{"a": NaN}')
    with pytest.raises(InputError, match="NaN is not a JSON number"):
        load_file(p)


def test_field_lines():
    lines = field_lines("a: 1\nsched:\n  n: 2\n  m: {k: 3}\n")
    assert lines == {"a": 1, "sched": 2, "sched.n": 3, "sched.m": 4, "sched.m.k": 4}


@pytest.mark.parametrize("item,msg", [("=5", "empty"), ("a..b=1", "empty part"),
                                      ("x", "FIELD.PATH=VALUE"), ("a=[1", "not valid YAML")])
def test_parse_set_refuses(item, msg):
    with pytest.raises(InputError, match=msg):
        parse_set(item)


def test_parse_set_values_are_yaml():
    assert parse_set("cache.prefix_match_unit=64") == ("cache.prefix_match_unit", 64)
    assert parse_set("a.b={x: [1, 2]}") == ("a.b", {"x": [1, 2]})
