import subprocess
import sys

import pytest

from bert_jax.errors import BertJaxError
from bert_jax.tasks import TASK_NAMES, get_task

EXPECTED = {
    "cola": ("classification", 2, "mcc"), "sst2": ("classification", 2, "accuracy"),
    "mrpc": ("classification", 2, "acc_and_f1"), "stsb": ("regression", 1, "corr"),
    "qqp": ("classification", 2, "acc_and_f1"), "mnli": ("classification", 3, "accuracy"),
    "qnli": ("classification", 2, "accuracy"), "rte": ("classification", 2, "accuracy"),
    "wnli": ("classification", 2, "accuracy"), "ax": ("classification", 3, "accuracy"),
    "squad_v1": ("span", 2, "f1"), "squad_v2": ("span", 2, "f1"),
    "conll2003": ("token_classification", 9, "f1"), "swag": ("multiple_choice", 1, "accuracy"),
}


def test_every_task_is_registered_with_kind_and_labels():
    assert set(TASK_NAMES) == set(EXPECTED)
    for name, (kind, num_labels, main) in EXPECTED.items():
        task = get_task(name)
        assert (task.name, task.kind, task.num_labels, task.main_metric) == (
            name, kind, num_labels, main)
        assert task.input_keys == ("input_ids", "input_mask", "segment_ids")
    assert get_task("SST-2").name == "sst2" and get_task("squad").name == "squad_v1"
    assert get_task("mnli").labels == ("contradiction", "entailment", "neutral")
    assert get_task("rte").labels == ("entailment", "not_entailment")
    with pytest.raises(BertJaxError, match="unknown task 'colaa'"):
        get_task("colaa")
    with pytest.raises(BertJaxError, match="unknown split 'validation'"):
        get_task("cola").read("validation", data_dir="/nonexistent")


def test_local_reading_does_not_import_tensorflow(tmp_path):
    (tmp_path / "dev.tsv").write_text("gj04\t1\t\tA b.\n", encoding="utf-8")
    code = (
        "import sys; from bert_jax.tasks import get_task; "
        f"ex = get_task('cola').read('dev', data_dir={str(tmp_path)!r}); "
        "assert len(ex) == 1; "
        "bad = [m for m in ('tensorflow', 'tensorflow_datasets') "
        "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
