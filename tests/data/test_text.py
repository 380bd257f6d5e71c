"""Raw-text reading, sentence splitting and document layout detection."""

import pytest

from bert_jax.data import text
from bert_jax.errors import BertJaxError


def test_split_sentences_keeps_abbreviations():
    s = "Mr. Smith went to Washington. He arrived at 5 p.m. on Monday! Did he? Yes."
    assert text.split_sentences(s) == [
        "Mr. Smith went to Washington.", "He arrived at 5 p.m. on Monday!", "Did he?", "Yes."]


def test_lines_and_paragraph_documents():
    lines = "One sentence.\nTwo sentence.\n\nOther doc.\n"
    assert text.split_documents(lines, "lines") == [["One sentence.", "Two sentence."],
                                                    ["Other doc."]]
    prose = ("First para wraps\nover two lines. Second sentence.\n\nNext paragraph.\n\n\n"
             "New chapter here.\n")
    assert text.split_documents(prose, "paragraphs") == [
        ["First para wraps over two lines.", "Second sentence.", "Next paragraph."],
        ["New chapter here."]]


def test_detect_format():
    bert = "\n".join(f"Sentence number {i} ends here." for i in range(20)) + "\n\nMore.\n"
    wrapped = "\n".join(["this line is wrapped and", "continues on the next one"] * 10)
    assert text.detect_format(bert) == "lines"
    assert text.detect_format(wrapped) == "paragraphs"
    prose = "Alpha beta. Gamma delta. Epsilon.\nZeta eta. Theta.\n"
    assert text.detect_format(prose) == "paragraphs"


def test_inputs_and_decoding(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "sub" / "b.txt").write_bytes(b"caf\xe9 \xff ok\n")
    (tmp_path / "d" / "a.txt").write_text("x\n")
    (tmp_path / "d" / "c.txt").write_text("y\n")
    (tmp_path / "d" / ".hidden").write_text("x\n")
    files, not_text = text.list_text_input_files([str(tmp_path / "d")])
    assert [f.rsplit("/", 1)[1] for f in files] == ["a.txt", "c.txt"] and not_text == 1
    with pytest.raises(BertJaxError, match=r"b.txt: not utf-8 text \(byte offset 3, line 1"):
        text.list_input_files([str(tmp_path / "d" / "sub" / "b.txt")])
    decoded = text.read_text_file(str(tmp_path / "d" / "sub" / "b.txt"))
    assert decoded.replaced_chars == 2 and decoded.text.startswith("caf\ufffd")
    with pytest.raises(BertJaxError, match="no such file"):
        text.list_input_files([str(tmp_path / "missing")])
