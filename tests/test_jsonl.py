"""common/jsonl.py: the one JSONL reader/writer and the atomic writes (round trips, bad lines named, logs cut
off by a killed run, interrupted writes that leave no half file)."""

import json

import pytest

from common.jsonl import (
    append_jsonl,
    iter_jsonl,
    read_finished,
    read_jsonl,
    write_atomic,
    write_json,
    write_jsonl,
)

RECORDS = [
    {"id": "q1", "question": "wo wurde Gödel geboren?"},
    {"id": "q2", "n": [1, 2.5, None]},
    "a string",
    7,
]


def test_write_then_read_round_trips_and_keeps_non_ascii(tmp_path):
    path = tmp_path / "r.jsonl"
    write_jsonl(path, RECORDS)
    assert read_jsonl(path) == RECORDS
    text = path.read_text(encoding="utf-8")
    assert "Gödel" in text and text.count("\n") == len(RECORDS) and text.endswith("\n")
    assert [json.loads(line) for line in text.splitlines()] == RECORDS  # one record per line
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


def test_blank_lines_are_skipped_and_line_numbers_count_them(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n\n   \n{"a": 2}\n', encoding="utf-8")
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]
    assert list(iter_jsonl(path)) == [(1, {"a": 1}), (4, {"a": 2})]


def test_a_bad_line_is_named_with_file_and_line(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"a": 1}\n\n{"a": \n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"mine.jsonl:3 is not valid JSON"):
        read_jsonl(path)
    records = iter_jsonl(path)
    assert next(records) == (1, {"a": 1})  # lazy: the good lines before come out first
    with pytest.raises(ValueError, match=r"mine.jsonl:3 is not valid JSON"):
        next(records)


def test_a_generator_is_written_as_it_is_consumed(tmp_path):
    path, seen = tmp_path / "g.jsonl", []

    def records():
        for k in range(3):
            seen.append(k)
            yield {"k": k}

    write_jsonl(path, records())
    assert seen == [0, 1, 2] and read_jsonl(path) == [{"k": 0}, {"k": 1}, {"k": 2}]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "r.jsonl"
    write_jsonl(path, [{"old": True}])

    def records():
        yield {"new": 1}
        raise RuntimeError("killed while writing")

    with pytest.raises(RuntimeError, match="killed"):
        write_jsonl(path, records())
    assert read_jsonl(path) == [{"old": True}]
    assert list(tmp_path.iterdir()) == [path]


def test_an_interrupted_write_leaves_no_file(tmp_path):  # (from test_get_model: gguf_convert writes this way)
    def crash(tmp):
        tmp.write_bytes(b"half a file")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomic(tmp_path / "model.safetensors", crash)
    assert not (tmp_path / "model.safetensors").exists()
    assert not list(tmp_path.iterdir())  # nor the temporary file


def test_write_json_is_indented_with_a_final_newline(tmp_path):
    write_json(tmp_path / "c.json", {"name": "Müller", "n": [1, 2]})
    text = (tmp_path / "c.json").read_text(encoding="utf-8")
    assert json.loads(text) == {"name": "Müller", "n": [1, 2]}
    assert text == '{\n  "name": "Müller",\n  "n": [\n    1,\n    2\n  ]\n}\n'


def test_appended_lines_are_flushed_at_once(tmp_path):
    path = tmp_path / "log.jsonl"
    with open(path, "a", encoding="utf-8") as file:
        append_jsonl(file, {"step": 1})
        assert read_jsonl(path) == [{"step": 1}]  # readable before the file is closed
        append_jsonl(file, {"step": 2})
    assert read_jsonl(path, appended=True) == [{"step": 1}, {"step": 2}]


def test_an_appended_file_may_be_missing_or_end_in_a_cut_off_line(tmp_path, capsys):
    path = tmp_path / "predictions.jsonl"
    assert read_jsonl(path, appended=True) == []
    with pytest.raises(FileNotFoundError):
        read_jsonl(path)  # a plain read needs the file
    path.write_text('{"id": "a"}\n{"id": "b"}\n{"id": "c", "answ', encoding="utf-8")  # killed mid-write
    with pytest.raises(ValueError, match="predictions.jsonl:3 is not valid JSON"):
        read_jsonl(path)
    assert read_jsonl(path, appended=True) == [{"id": "a"}, {"id": "b"}]
    assert "dropping an unfinished last line" in capsys.readouterr().out
    assert path.read_text(encoding="utf-8") == '{"id": "a"}\n{"id": "b"}\n'  # cut from the file too
    with open(path, "a", encoding="utf-8") as file:  # so appending goes on after the last complete record
        append_jsonl(file, {"id": "c"})
    assert read_jsonl(path) == [{"id": "a"}, {"id": "b"}, {"id": "c"}]
    path.write_text('{"id": "only"', encoding="utf-8")  # the first line cut off: nothing is left
    assert read_jsonl(path, appended=True) == [] and path.read_text() == ""


def test_a_file_another_process_appends_to_is_read_without_touching_it(tmp_path):
    path = tmp_path / "p.jsonl"
    assert read_finished(path) == []
    path.write_text('{"id": 1}\n{"id": 2}\n{"id": 3, "quest')  # its writer is half way through line 3
    assert read_finished(path) == [{"id": 1}, {"id": 2}]
    assert path.read_text().endswith('"quest')  # left for the writer to finish


def test_a_record_holding_a_unicode_line_separator_stays_one_record(tmp_path):
    path = tmp_path / "p.jsonl"  # json.dumps(ensure_ascii=False) leaves U+2028, U+2029 and U+0085 as they are
    records = [{"label": "a\u2028b"}, {"label": "c\u0085d\u2029"}]
    write_jsonl(path, records)
    assert read_finished(path) == records == read_jsonl(path)
    path.write_text('{"id": 1}\n{"id": 2, "bad\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"p.jsonl:2 is not valid JSON"):
        read_finished(path)  # a complete but broken line is named like read_jsonl names it
