import numpy as np
import pytest

from bert_jax.errors import BertJaxError
from bert_jax.tasks import IGNORE_INDEX, get_task
from bert_jax.tasks.ner import NER_LABELS, NerExample, to_iob2

CONLL = """-DOCSTART- -X- -X- O

EU NNP I-NP I-ORG
rejects VBZ I-VP O
German JJ I-NP I-MISC
call NN I-NP O
. . O O

John NNP I-NP I-PER
Smith NNP I-NP I-PER
Paris NNP I-NP B-PER

-DOCSTART- -X- -X- O

York NNP I-NP I-LOC
"""


def test_reader_docstart_blank_lines_and_iob1_to_iob2(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text(CONLL, encoding="utf-8")
    task = get_task("conll2003")
    ex = task.read("train", data_dir=str(tmp_path))
    assert [e.words for e in ex] == [("EU", "rejects", "German", "call", "."),
                                     ("John", "Smith", "Paris"), ("York",)]
    assert ex[0].labels == ("B-ORG", "O", "B-MISC", "O", "O")
    assert ex[1].labels == ("B-PER", "I-PER", "B-PER")  # IOB1 B- between adjacent entities
    kept = task.read("train", files=str(path), scheme="keep")
    assert kept[1].labels == ("I-PER", "I-PER", "B-PER")
    assert to_iob2(["B-PER", "I-PER", "I-LOC", "O", "I-ORG"]) == [
        "B-PER", "I-PER", "B-LOC", "O", "B-ORG"]


def test_reader_reports_bad_lines(tmp_path):
    path = tmp_path / "valid.txt"
    path.write_text("A NNP I-NP B-PER\nB NNP I-NP B-PERSON\n\nC NNP I-NP O\n\nlonely\n",
                    encoding="utf-8")
    task = get_task("conll2003")
    with pytest.raises(BertJaxError, match=r"valid\.txt:2: tag 'B-PERSON'"):
        task.read("dev", data_dir=str(tmp_path))
    ex = task.read("dev", files=str(path), on_error="skip")
    assert [e.words for e in ex] == [("C",)]  # a bad line drops its sentence
    assert len(ex.skipped) == 2 and ex.skipped[1].startswith(f"{path}:6: expected")


EXAMPLES = [
    NerExample("0", ("John", "Smith", "lives", "in", "unbelievable", "Denver", "xyz", "."),
               ("B-PER", "I-PER", "O", "O", "B-MISC", "B-LOC", "I-LOC", "O")),
    NerExample("1", ("EU", "rejects", "German", "lamb"), ("B-ORG", "O", "B-MISC", "O")),
]


def one_hot_logits(label_ids, rng):
    """Logits whose argmax is the gold label at labelled positions, noise elsewhere."""
    logits = rng.normal(size=label_ids.shape + (len(NER_LABELS),))
    rows, cols = np.nonzero(label_ids != IGNORE_INDEX)
    logits[rows, cols, label_ids[rows, cols]] = 100.0
    return logits


@pytest.mark.parametrize("max_seq_length", [32, 6])
def test_alignment_round_trip(tokenizer, max_seq_length):
    task = get_task("conll2003")
    f = task.featurize(EXAMPLES, tokenizer, max_seq_length)
    ids, labels, words = f["input_ids"], f["label_ids"], f["word_index"]
    assert ids.shape == labels.shape == words.shape and ids.shape[1] == max_seq_length
    assert ids.dtype == labels.dtype == np.int32
    # Labels only on first sub-tokens, which are exactly the word starts.
    np.testing.assert_array_equal(labels != IGNORE_INDEX, words >= 0)
    assert (labels[:, 0] == IGNORE_INDEX).all()  # [CLS]
    if max_seq_length == 32:
        assert f["example_index"].tolist() == [0, 1]
        toks = [tokenizer.id_to_token(i) for i in ids[0][:f["input_mask"][0].sum()]]
        assert toks == ["[CLS]", "john", "smith", "lives", "in", "un", "##believ", "##able",
                        "den", "##ver", "[UNK]", ".", "[SEP]"]
        assert labels[0, 5:8].tolist() == [NER_LABELS.index("B-MISC"), IGNORE_INDEX,
                                           IGNORE_INDEX]
        assert words[0, 5:8].tolist() == [4, -1, -1]
    else:  # 4 tokens per feature: sentences are split at word boundaries
        assert f["example_index"].tolist() == [0, 0, 0, 1]
    preds = task.postprocess(f, one_hot_logits(labels, np.random.default_rng(0)), EXAMPLES)
    assert [tuple(p) for p in preds] == [e.labels for e in EXAMPLES]
    assert task.metrics(preds, EXAMPLES)["f1"] == 100.0


def test_prediction_file_is_conlleval_input(tmp_path):
    task = get_task("conll2003")
    preds = [list(EXAMPLES[0].labels), ["B-ORG", "O", "O", "O"]]
    (path,) = task.write_predictions(preds, EXAMPLES, str(tmp_path), "dev")
    lines = open(path, encoding="utf-8").read().split("\n")
    assert lines[0] == "John B-PER B-PER"
    assert lines[8] == "" and lines[9] == "EU B-ORG B-ORG" and lines[11] == "German B-MISC O"
    m = task.metrics(preds, EXAMPLES)
    assert m["recall"] == pytest.approx(100 * 4 / 5) and m["precision"] == 100.0
