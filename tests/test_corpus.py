"""Corpus directories: README/LICENSE-like files are left out (and reported) by both the
tokenizer trainer and the pretraining-data writer; a file named explicitly is always used."""

import pytest

from bert_jax.corpus import is_meta_file, list_corpus_files
from bert_jax.data import text
from bert_jax.errors import BertJaxError
from bert_jax.tokenization.sentencepiece import CorpusReport, list_text_files


@pytest.fixture
def corpus(tmp_path):
    (tmp_path / "c" / "sub").mkdir(parents=True)
    for name in ("README.md", "LICENSE", "MANIFEST.in", "book.txt", "readme_notes.txt",
                 ".hidden.txt"):
        (tmp_path / "c" / name).write_text("Some text.\n")
    (tmp_path / "c" / "sub" / "COPYING.txt").write_text("GPL\n")
    (tmp_path / "c" / "sub" / "more.txt").write_text("More text.\n")
    return tmp_path / "c"


def test_meta_files_are_skipped_and_counted(corpus, capsys):
    found = list_corpus_files([str(corpus)])
    assert [p.rsplit("/", 1)[1] for p in found.files] == ["book.txt", "readme_notes.txt",
                                                         "more.txt"]
    assert sorted(p.rsplit("/", 1)[1] for p in found.skipped) == [
        "COPYING.txt", "LICENSE", "MANIFEST.in", "README.md"]
    assert "skipped 4 README/LICENSE-like files" in found.skipped_note()
    # Named explicitly, a README is used.
    assert list_corpus_files([str(corpus / "README.md")]).files == [str(corpus / "README.md")]
    report = CorpusReport()
    assert len(list_text_files([str(corpus)], report)) == 3 and report.meta_files == 4
    assert "4 README/LICENSE-like skipped" in report.summary()
    assert len(text.list_input_files([str(corpus)])) == 3
    assert "skipped 4 README/LICENSE-like files" in capsys.readouterr().err
    assert is_meta_file("LICENCE.rst") and not is_meta_file("licensed_works.txt")


def test_only_meta_files_is_an_error(tmp_path):
    (tmp_path / "README").write_text("x\n")
    with pytest.raises(BertJaxError, match="no text files found.*1 README/LICENSE-like"):
        list_corpus_files([str(tmp_path)])
