import os

import numpy as np
import pytest

from bert_jax.errors import BertJaxError
from bert_jax.tasks import get_task


def write(path, text, bom=False):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8-sig" if bom else "utf-8", newline="") as f:
        f.write(text)
    return str(path)


COLA_TRAIN = ("gj04\t1\t\tOur friends won't buy this analysis.\n"
              "gj04\t0\t*\tThey drank the pub.\n"
              "cj99\t1\t\tThe \"quoted\" word stays.\n")


def test_cola_train_has_no_header_and_test_has_one(tmp_path):
    task = get_task("cola")
    write(tmp_path / "CoLA" / "train.tsv", COLA_TRAIN)
    write(tmp_path / "CoLA" / "test.tsv", "index\tsentence\n0\tBill whistled.\n1\tA b.\n")
    train = task.read("train", data_dir=str(tmp_path))  # the GLUE root works ...
    assert [e.label for e in train] == ["1", "0", "1"]
    assert train[0].text_a == "Our friends won't buy this analysis."
    assert train[2].text_a == 'The "quoted" word stays.'
    test = task.read("test", data_dir=str(tmp_path / "CoLA"))  # ... and the task folder
    assert [(e.index, e.text_a, e.label) for e in test] == [("0", "Bill whistled.", None),
                                                             ("1", "A b.", None)]


def test_mrpc_byte_order_mark_and_column_names(tmp_path):
    path = write(tmp_path / "train.tsv",
                 "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
                 '1\t702876\t702977\tAmrozi accused his brother, "the witness".\tHe did.\n'
                 "0\t2108705\t2108831\tYucaipa owned it.\tYucaipa bought it.\n", bom=True)
    with open(path, "rb") as f:
        assert f.read(3) == b"\xef\xbb\xbf"
    ex = get_task("mrpc").read("train", files=path)
    assert [(e.label, e.text_b) for e in ex] == [("1", "He did."), ("0", "Yucaipa bought it.")]
    assert ex[0].text_a == 'Amrozi accused his brother, "the witness".'


def test_stray_quotes_do_not_merge_rows(tmp_path):
    # A quoting CSV reader would read from the first '"' across tabs and newlines.
    path = write(tmp_path / "dev.tsv",
                 "index\tsentence1\tsentence2\tlabel\n"
                 '0\tHe said "hello.\tShe left.\tentailment\n'
                 '1\t"Quoted start\tx y\tnot_entailment\n'
                 "2\tplain\tplain\tentailment\n")
    ex = get_task("rte").read("dev", files=path)
    assert len(ex) == 3
    assert ex[0].text_a == 'He said "hello.' and ex[1].text_a == '"Quoted start'
    assert [e.label for e in ex] == ["entailment", "not_entailment", "entailment"]


def test_mnli_by_header_names_and_stsb_scores(tmp_path):
    cols = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse",
            "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1",
            "sentence2", "label1", "label2", "label3", "label4", "label5", "gold_label"]
    row = ["7", "1", "1n", "fiction", "( a )", "( b )", "(a)", "(b)", "A man walks.",
           "A man runs.", "neutral", "neutral", "entailment", "neutral", "neutral", "neutral"]
    write(tmp_path / "MNLI" / "dev_mismatched.tsv", "\t".join(cols) + "\n" + "\t".join(row) + "\n")
    write(tmp_path / "MNLI" / "test_matched.tsv",
          "\t".join(cols[:10]) + "\n" + "\t".join(row[:10]) + "\n")
    mnli = get_task("mnli")
    assert mnli.eval_splits == ("dev_matched", "dev_mismatched")
    dev = mnli.read("dev_mismatched", data_dir=str(tmp_path))
    assert (dev[0].text_a, dev[0].text_b, dev[0].label, dev[0].index) == (
        "A man walks.", "A man runs.", "neutral", "7")
    assert mnli.read("test_matched", data_dir=str(tmp_path))[0].label is None

    stsb = write(tmp_path / "sts.tsv",
                 "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\t"
                 "sentence2\tscore\n0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\t"
                 "A plane is taking off.\tAn air plane is taking off.\t5.000\n")
    assert get_task("stsb").read("train", files=stsb)[0].label == 5.0


def test_malformed_rows_name_file_and_line(tmp_path):
    path = write(tmp_path / "RTE" / "train.tsv",
                 "index\tsentence1\tsentence2\tlabel\n"
                 "0\ta\tb\tentailment\n"
                 "1\tonly three\tcolumns\n"
                 "2\ta\tb\tmaybe\n"
                 "3\ta\tb\tnot_entailment\n")
    task = get_task("rte")
    with pytest.raises(BertJaxError, match=r"RTE/train\.tsv:3: expected 4 .* found 3"):
        task.read("train", files=path)
    ex = task.read("train", files=path, on_error="skip")
    assert [e.index for e in ex] == ["0", "3"]
    assert len(ex.skipped) == 2
    assert ex.skipped[1].startswith(f"{path}:4: label 'maybe'")
    cola = write(tmp_path / "cola.tsv", COLA_TRAIN + "gj04\t2\t\tBad label.\n")
    with pytest.raises(BertJaxError, match=r"cola\.tsv:4: label '2'"):
        get_task("cola").read("train", files=cola)
    sts = write(tmp_path / "sts.tsv", "index\tsentence1\tsentence2\tscore\n0\ta\tb\tfive\n")
    with pytest.raises(BertJaxError, match=r"sts\.tsv:2: score 'five'"):
        get_task("stsb").read("train", files=sts)
    with pytest.raises(BertJaxError, match="lacks the label column"):
        get_task("rte").read("dev", files=write(tmp_path / "x.tsv", "index\tsentence1\t"
                                                "sentence2\n0\ta\tb\n"))
    with pytest.raises(BertJaxError, match="no file for split 'dev'"):
        get_task("rte").read("dev", data_dir=str(tmp_path))


def test_featurize_truncates_longest_first_and_labels(tokenizer, tmp_path):
    task = get_task("qnli")
    path = write(tmp_path / "dev.tsv", "index\tquestion\tsentence\tlabel\n"
                 "0\twho won\tthe denver broncos won the super bowl game\tentailment\n"
                 "1\twhat\tparis\tnot_entailment\n")
    ex = task.read("dev", files=path)
    f = task.featurize(ex, tokenizer, max_seq_length=10)
    assert f["input_ids"].shape == (2, 10) and f["input_ids"].dtype == np.int32
    ids = f["input_ids"][0].tolist()
    # 7 slots: "who won" (2) keeps both, the sentence (11 tokens) is cut to 5.
    assert ids[:4] == [tokenizer.cls_id, tokenizer.token_to_id("who"),
                       tokenizer.token_to_id("won"), tokenizer.sep_id]
    assert f["segment_ids"][0].tolist() == [0] * 4 + [1] * 6
    assert f["input_mask"][1].tolist() == [1] * 5 + [0] * 5
    assert f["input_ids"][1, 5:].tolist() == [tokenizer.pad_id] * 5
    assert f["label_ids"].tolist() == [0, 1]
    assert task.postprocess(f, np.array([[0.1, 2.0], [3.0, 0.0]]), ex) == [
        "not_entailment", "entailment"]
    stsb = get_task("stsb")
    sts_ex = stsb.read("dev", files=write(tmp_path / "s.tsv", "index\tsentence1\tsentence2\t"
                                          "score\n0\ta\tb\t3.8\n"))
    sf = stsb.featurize(sts_ex, tokenizer, 8)
    assert sf["labels"].dtype == np.float32 and sf["labels"][0] == pytest.approx(3.8)
    assert "label_ids" not in get_task("cola").featurize(
        get_task("cola").read("test", files=write(tmp_path / "t.tsv", "index\tsentence\n0\ta\n")),
        tokenizer, 8)


def test_metrics_per_task(tmp_path):
    mrpc = get_task("mrpc")
    path = write(tmp_path / "m.tsv", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n" + "".join(
        f"{y}\t1\t2\ta\tb\n" for y in "1101"))
    ex = mrpc.read("dev", files=path)
    out = mrpc.metrics(["1", "0", "0", "1"], ex)
    assert out["accuracy"] == 0.75 and out["f1"] == pytest.approx(0.8)
    assert out["acc_and_f1"] == pytest.approx(0.775) and mrpc.main_metric == "acc_and_f1"
    cola = get_task("cola")
    cex = cola.read("train", files=write(tmp_path / "c.tsv", COLA_TRAIN))
    assert cola.metrics(["1", "0", "1"], cex)["mcc"] == pytest.approx(1.0)
    stsb = get_task("stsb")
    sex = stsb.read("dev", files=write(tmp_path / "s.tsv", "index\tsentence1\tsentence2\tscore\n"
                                       "0\ta\tb\t1.0\n1\ta\tb\t2.0\n2\ta\tb\t4.5\n"))
    out = stsb.metrics([0.5, 2.5, 2.0], sex)
    assert set(out) == {"pearson", "spearman", "corr"}
    assert out["spearman"] == pytest.approx(0.5)
    assert out["corr"] == pytest.approx((out["pearson"] + 0.5) / 2)
    with pytest.raises(BertJaxError, match="without labels"):
        cola.metrics(["1"], cola.read("test", files=write(tmp_path / "t.tsv",
                                                          "index\tsentence\n0\ta\n")))


@pytest.mark.parametrize("name,split,filename,labels", [
    ("cola", "test", "CoLA.tsv", ["0", "1"]),
    ("sst2", "test", "SST-2.tsv", ["1", "0"]),
    ("mrpc", "test", "MRPC.tsv", ["1", "1"]),
    ("stsb", "test", "STS-B.tsv", [4.21, 0.5]),
    ("qqp", "test", "QQP.tsv", ["0", "0"]),
    ("mnli", "test_matched", "MNLI-m.tsv", ["entailment", "neutral"]),
    ("mnli", "test_mismatched", "MNLI-mm.tsv", ["contradiction", "neutral"]),
    ("qnli", "test", "QNLI.tsv", ["entailment", "not_entailment"]),
    ("rte", "test", "RTE.tsv", ["not_entailment", "entailment"]),
    ("wnli", "test", "WNLI.tsv", ["1", "0"]),
    ("ax", "test", "AX.tsv", ["neutral", "entailment"]),
])
def test_submission_files(tmp_path, name, split, filename, labels):
    task = get_task(name)
    index_col = "id" if name == "qqp" else "index"
    a, b = task.spec.text_a, task.spec.text_b
    header = [index_col, a] + ([b] if b else [])
    rows = [[str(10 + i), "some text"] + (["more text"] if b else []) for i in range(2)]
    path = write(tmp_path / "in" / "test.tsv", "\n".join("\t".join(r) for r in [header, *rows])
                 + "\n")
    ex = task.read(split, files=path)
    written = task.write_predictions(labels, ex, str(tmp_path / "out"), split)
    assert written == [str(tmp_path / "out" / filename)]
    with open(written[0], encoding="utf-8") as f:
        lines = f.read().splitlines()
    shown = [f"{x:.3f}" if isinstance(x, float) else x for x in labels]
    assert lines == ["index\tprediction", f"10\t{shown[0]}", f"11\t{shown[1]}"]
