"""The argument coercion helpers (``airflow_provider_plgd.coerce``) and the one JSON writer
(``storage.write_json``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_plgd import coerce
from airflow_provider_plgd.tables import storage


def test_parse_bool_accepts_bools_and_rendered_text_only():
    assert coerce.parse_bool(True, "x") is True and coerce.parse_bool(" On ", "x") is True
    assert coerce.parse_bool("None", "x") is False and coerce.parse_bool("", "x") is False
    with pytest.raises(ValueError, match="flag must be true or false, got 'maybe'"):
        coerce.parse_bool("maybe", "flag")


def test_lists_from_lists_single_strings_and_rendered_lists():
    assert coerce.as_list("['a', 'b']", "x") == ["a", "b"] and coerce.as_list("a", "x") == ["a"]
    for bad in ([], "[1, ", 5):
        with pytest.raises(ValueError, match="owner_ids must be"):
            coerce.as_list(bad, "owner_ids")
    assert coerce.token_list("", "x") == [] and coerce.token_list("ab", "x") == ["ab"]
    assert coerce.token_list(None, "x") == [] and coerce.token_list(("a",), "x") == ["a"]
    with pytest.raises(ValueError, match="owner_id param must be a list"):
        coerce.token_list(3, "owner_id")


def test_numbers_refuse_bools_and_out_of_range_values():
    assert coerce.positive_int(" 7 ", "x") == 7 and coerce.positive_int(3, "x") == 3
    for bad in (True, 0, "x", None):
        with pytest.raises(ValueError, match="start_seq must be a positive integer"):
            coerce.positive_int(bad, "start_seq")
    assert coerce.non_negative_seconds("1.5", "x") == 1.5 and coerce.non_negative_seconds(0, "x") == 0.0
    for bad in (False, -1, float("nan"), float("inf"), "soon"):
        with pytest.raises(ValueError, match="settle_seconds must be a number of seconds >= 0"):
            coerce.non_negative_seconds(bad, "settle_seconds")


def test_write_json_is_sorted_indented_with_a_trailing_newline(tmp_path):
    path = str(tmp_path / "a" / "doc.json")
    storage.write_json(path, {"b": 1, "a": [1]})
    assert Path(path).read_text() == '{\n  "a": [\n    1\n  ],\n  "b": 1\n}\n'
    storage.write_json(path, {"b": 1, "a": 2}, indent=1)
    assert Path(path).read_text() == '{\n "a": 2,\n "b": 1\n}\n'
    fs, local = storage.to_fs(path)
    storage.write_json(local, {"t": object()}, fs=fs, default=lambda v: "obj")
    assert storage.read_json(path) == {"t": "obj"}
    with pytest.raises(TypeError):
        storage.write_json(path, {"t": object()})
