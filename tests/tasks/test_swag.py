import numpy as np
import pytest

from bert_jax.errors import BertJaxError
from bert_jax.tasks import get_task

HEADER = ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3"


def swag_csv(tmp_path, rows, label=True, name="val.csv"):
    path = tmp_path / name
    path.write_text("\n".join([HEADER + (",label" if label else ""), *rows]) + "\n",
                    encoding="utf-8")
    return str(path)


ROW0 = ('0,lsmdc3001,1000,"A man walks. The dog","A man walks.","The dog",gold,sits.,runs.,'
        '"eats, then sits.",walks.,1')
ROW1 = '7,anetv_x,2,She is in the park. She,She is in the park.,She,gen,runs.,sits.,eats.,walks.,3'


def test_reader_quoted_fields_and_labels(tmp_path):
    task = get_task("swag")
    swag_csv(tmp_path, [ROW0, ROW1])
    ex = task.read("dev", data_dir=str(tmp_path))  # finds val.csv
    assert [(e.index, e.label) for e in ex] == [("0", 1), ("7", 3)]
    assert ex[0].context == "A man walks." and ex[0].start == "The dog"
    assert ex[0].endings == ("sits.", "runs.", "eats, then sits.", "walks.")
    test = task.read("test", files=swag_csv(tmp_path, [ROW0.rsplit(",", 1)[0]], label=False,
                                            name="t.csv"))
    assert test[0].label is None


def test_malformed_rows(tmp_path):
    task = get_task("swag")
    path = swag_csv(tmp_path, [ROW0, "1,v,1,a,b,c,gold,e0,e1,e2,e3,4", "2,v,1,a,b"])
    with pytest.raises(BertJaxError, match=r"val\.csv:3: label '4'"):
        task.read("dev", files=path)
    ex = task.read("dev", files=path, on_error="skip")
    assert len(ex) == 1 and len(ex.skipped) == 2 and "val.csv:4: expected 12 columns" in \
        ex.skipped[1]
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b,c\n1,2,3\n", encoding="utf-8")
    with pytest.raises(BertJaxError, match="lacks SWAG column"):
        task.read("dev", files=str(bad))


def test_featurize_one_input_per_choice(tmp_path, tokenizer):
    task = get_task("swag")
    ex = task.read("dev", files=swag_csv(tmp_path, [ROW0, ROW1]))
    f = task.featurize(ex, tokenizer, 12)
    assert f["input_ids"].shape == f["segment_ids"].shape == (2, 4, 12)
    assert f["label_ids"].tolist() == [1, 3]
    first = [tokenizer.id_to_token(i) for i in f["input_ids"][0, 1] if i != tokenizer.pad_id]
    # [CLS] context [SEP] start + ending [SEP]
    assert first == ["[CLS]", "a", "man", "walks", ".", "[SEP]", "the", "dog", "runs", ".",
                     "[SEP]"]
    assert f["segment_ids"][0, 1].tolist() == [0] * 6 + [1] * 5 + [0]
    preds = task.postprocess(f, np.array([[0.0, 2.0, 1.0, 0.0], [5.0, 0.0, 0.0, 1.0]]), ex)
    assert preds == [1, 0]
    assert task.metrics(preds, ex) == {"accuracy": 0.5}
    (path,) = task.write_predictions(preds, ex, str(tmp_path / "out"), "dev")
    assert open(path, encoding="utf-8").read().splitlines() == ["index,prediction", "0,1", "7,0"]
