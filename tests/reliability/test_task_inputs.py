"""Task files: a score outside the task's range and a non-UTF-8 byte are errors that name
the file and line (or byte offset), never silent training data or a traceback."""

import pytest

from bert_jax.errors import BertJaxError
from bert_jax.tasks import get_task

STS_HEADER = "index\tsentence1\tsentence2\tscore\n"


def test_regression_score_outside_range_names_file_and_line(tmp_path):
    sts = tmp_path / "sts.tsv"
    sts.write_text(STS_HEADER + "0\ta\tb\t4.5\n1\ta\tb\t7.0\n2\ta\tb\t-0.5\n")
    with pytest.raises(BertJaxError, match=r"sts\.tsv:3: score '7.0' is outside the task's "
                                           r"range \[0, 5\]"):
        get_task("stsb").read("train", files=str(sts))
    kept = get_task("stsb").read("train", files=str(sts), on_error="skip")
    assert [e.label for e in kept] == [4.5] and len(kept.skipped) == 2


@pytest.mark.parametrize("task,name,content", [
    ("stsb", "sts.tsv", STS_HEADER.encode() + b"0\ta\t\xe9t\xe9\t1.0\n"),
    ("squad", "train.json", b'{"version": "1.1", "data": [{"title": "\xff"}]}'),
])
def test_non_utf8_task_file_names_byte_offset(tmp_path, task, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    offset = content.index(b"\xe9" if task == "stsb" else b"\xff")
    with pytest.raises(BertJaxError, match=rf"{name}: not utf-8 text \(byte offset {offset}"):
        get_task(task).read("train", files=str(path))
