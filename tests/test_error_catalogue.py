"""Every user mistake ends in exactly one ``error:`` line (exit 2), no traceback, and leaves
the workdir or output it names untouched.

Each case builds its inputs under ``tmp_path`` and returns the argv for
``bert_jax.cli.main`` and the directory that must not change; the CLI runs in-process.
"""

import json
import os

import pytest

from bert_jax.checkpoint import store
from bert_jax.cli import main
from bert_jax.training import config as config_lib
from tests.data.helpers import write_shards
from tests.finetuning.helpers import write_checkpoint
from tests.training.helpers import EXPERIMENT, SMALL

PRETRAIN = ["pretrain", "--config", f"{EXPERIMENT}:tiny", *SMALL]


def _pretrain_without(*keys):
    """PRETRAIN less the SMALL overrides of ``keys`` (a case sets them itself)."""
    return [a for a in PRETRAIN if not any(a.startswith(f"--config.{k}=") for k in keys)]


def _snapshot(directory):
    """Every file (with its bytes and mode) and every folder under ``directory``."""
    directory = str(directory)
    if not os.path.exists(directory):
        return None
    if os.path.isfile(directory):
        return open(directory, "rb").read()
    tree = {}
    for d, dirs, files in os.walk(directory):
        for name in dirs:
            path = os.path.join(d, name)
            tree[os.path.relpath(path, directory) + "/"] = os.stat(path).st_mode
        for name in files:
            path = os.path.join(d, name)
            tree[os.path.relpath(path, directory)] = (os.stat(path).st_mode,
                                                      open(path, "rb").read())
    return tree


def _largest_file(directory):
    files = [os.path.join(d, f) for d, _, fs in os.walk(directory) for f in fs]
    return max(files, key=os.path.getsize)


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_checkpoint(str(tmp_path_factory.mktemp("ckpt") / "model"))


def _damaged_model(tmp_path, model_dir):
    import shutil

    damaged = str(tmp_path / "damaged")
    shutil.copytree(model_dir, damaged)
    _truncate(_largest_file(os.path.join(damaged, "params")))
    return damaged


def _pretraining_workdir(tmp_path, *overrides):
    workdir = tmp_path / "run"
    config = config_lib.load_config(f"{EXPERIMENT}:tiny", [*SMALL, *overrides])
    store.write_config(str(workdir), config_lib.model_config(config),
                       extra={"experiment": config.to_dict()})
    os.makedirs(workdir / "checkpoints" / "10" / "params")
    return workdir


# ---- the cases: (tmp_path, model_dir) -> (argv, directory that must stay unchanged) ------
def pretrain_zero_batch(tmp, _):
    return [*_pretrain_without("global_batch_size"), "--workdir", f"{tmp}/w",
            "--config.global_batch_size=0"], tmp


def pretrain_nan_learning_rate(tmp, _):
    return [*PRETRAIN, "--workdir", f"{tmp}/w", "--config.optimizer.learning_rate=nan"], tmp


def pretrain_zero_log_every(tmp, _):
    return [*PRETRAIN, "--workdir", f"{tmp}/w", "--config.log_every=0"], tmp


def pretrain_zero_eval_every(tmp, _):
    return [*PRETRAIN, "--workdir", f"{tmp}/w", "--config.eval_every=0"], tmp


def pretrain_probability_above_one(tmp, _):
    return [*PRETRAIN, "--workdir", f"{tmp}/w", "--config.data.masked_lm_prob=1.5"], tmp


def pretrain_unknown_variant(tmp, _):
    return ["pretrain", "--config", f"{EXPERIMENT}:bert_huge", "--workdir", f"{tmp}/w"], tmp


def pretrain_other_model_shape(tmp, _):
    workdir = _pretraining_workdir(tmp)
    return [*PRETRAIN, "--workdir", str(workdir), "--config.model.type_vocab_size=3"], workdir


def pretrain_into_fine_tuning_workdir(tmp, _):
    config = config_lib.load_config(f"{EXPERIMENT}:tiny", SMALL)
    store.write_config(str(tmp / "ft"), config_lib.model_config(config),
                       extra={"task": "sst2", "finetune": {}})
    return [*PRETRAIN, "--workdir", str(tmp / "ft")], tmp / "ft"


def pretrain_workdir_is_a_file(tmp, _):
    (tmp / "file").write_text("x")
    return [*PRETRAIN, "--workdir", str(tmp / "file")], tmp


def pretrain_zero_byte_shard(tmp, _):
    data = tmp / "data"
    write_shards(str(data), num_examples=20, num_shards=2)
    open(data / "train-00001-of-00002.tfrecord", "w").close()
    return [*_pretrain_without("model.vocab_size", "data.source"), "--workdir", f"{tmp}/w",
            "--config.data.source=tfrecord", f"--config.data.directory={data}"], tmp


def pretrain_decay_before_warmup(tmp, _):
    """Found only when the optimizer is built: still nothing written, no folder made."""
    return [*PRETRAIN, "--workdir", f"{tmp}/new/w", "--config.optimizer.warmup_steps=30",
            "--config.optimizer.decay_steps=25"], tmp


def pretrain_decay_before_warmup_in_existing_workdir(tmp, _):
    workdir = tmp / "run"
    config = config_lib.load_config(f"{EXPERIMENT}:tiny", SMALL)
    store.write_config(str(workdir), config_lib.model_config(config),
                       extra={"experiment": config.to_dict()})
    return [*PRETRAIN, "--workdir", str(workdir), "--config.optimizer.warmup_steps=30",
            "--config.optimizer.decay_steps=25", "--config.model.hidden_dropout_prob=0.2"], tmp


def pretrain_overwrite_rejected_late(tmp, _):
    """--overwrite moves the old contents aside; a run rejected later moves them back."""
    config = config_lib.load_config(f"{EXPERIMENT}:tiny", SMALL)
    store.write_config(str(tmp / "ft"), config_lib.model_config(config),
                       extra={"task": "sst2", "finetune": {}})
    return [*PRETRAIN, "--workdir", str(tmp / "ft"), "--overwrite",
            "--config.optimizer.warmup_steps=30", "--config.optimizer.decay_steps=25"], tmp


def pretrain_checkpoint_of_another_shape(tmp, _):
    """config.json agrees with the run, the saved step does not: the restore fails, and the
    workdir (config.json included) stays as it was."""
    import jax
    import numpy as np

    from bert_jax.checkpoint.manager import CheckpointManager
    from bert_jax.runs.state import TrainState

    workdir = tmp / "run"
    config = config_lib.load_config(f"{EXPERIMENT}:tiny", SMALL)
    store.write_config(str(workdir), config_lib.model_config(config),
                       extra={"experiment": config.to_dict()})
    params = {"dense": {"kernel": np.ones((4, 2), np.float32)}}
    manager = CheckpointManager(str(workdir), every_steps=1, keep=1)
    manager.save(1, TrainState.create(params, {"mu": params}), jax.random.PRNGKey(0),
                 {"step": 1})
    manager.close()
    return [*PRETRAIN, "--workdir", str(workdir), "--config.model.hidden_dropout_prob=0.2"], tmp


def pretrain_garbage_init_checkpoint(tmp, model_dir):
    import shutil

    shutil.copytree(model_dir, tmp / "init")
    garbage = _largest_file(tmp / "init" / "params")
    size = os.path.getsize(garbage)
    with open(garbage, "wb") as f:
        f.write(os.urandom(size))
    return [*PRETRAIN, "--workdir", f"{tmp}/w", f"--config.init_checkpoint={tmp}/init"], tmp


def fill_mask_zero_top_k(tmp, model_dir):
    return ["fill-mask", model_dir, "--text", "the [MASK] .", "--top-k", "0"], model_dir


def fill_mask_negative_top_k(tmp, model_dir):
    return ["fill-mask", model_dir, "--text", "the [MASK] .", "--top-k", "-3"], model_dir


def fill_mask_damaged_checkpoint(tmp, model_dir):
    damaged = _damaged_model(tmp, model_dir)
    return ["fill-mask", damaged, "--text", "the [MASK] ."], damaged


def embed_non_utf8_input(tmp, model_dir):
    (tmp / "in.txt").write_bytes(b"the cat\nthe \xff dog\n")
    return ["embed", model_dir, "--input", str(tmp / "in.txt"), "--output",
            str(tmp / "v.npy")], tmp


def fill_mask_input_is_a_directory(tmp, model_dir):
    return ["fill-mask", model_dir, "--input", str(tmp)], tmp


def embed_output_is_a_directory(tmp, model_dir):
    (tmp / "out.npy").mkdir()
    return ["embed", model_dir, "--text", "the cat", "--output", str(tmp / "out.npy")], tmp


def embed_output_cannot_be_written(tmp, _):
    """Checked before anything else: the checkpoint named does not even exist."""
    return ["embed", str(tmp / "no-model"), "--text", "the cat", "--output",
            "/proc/x.npy"], tmp


def embed_damaged_config(tmp, model_dir):
    damaged = _damaged_model(tmp, model_dir)
    with open(os.path.join(damaged, "config.json"), "r+b") as f:
        f.truncate(40)
    return ["embed", damaged, "--text", "the cat", "--output", str(tmp / "v.npy")], tmp


def export_damaged_checkpoint(tmp, model_dir):
    damaged = _damaged_model(tmp, model_dir)
    return ["export", damaged, "--output", str(tmp / "hf")], tmp


def export_output_is_a_file(tmp, model_dir):
    (tmp / "hf").write_text("x")
    return ["export", model_dir, "--output", str(tmp / "hf")], tmp


def convert_truncated_safetensors(tmp, _):
    hf = tmp / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({
        "model_type": "bert", "architectures": ["BertModel"], "vocab_size": 20,
        "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 16, "max_position_embeddings": 16}))
    (hf / "model.safetensors").write_bytes(b"\x40\x00\x00\x00\x00\x00\x00\x00{\"a\":")
    return ["convert", str(hf), "--output", str(tmp / "out")], tmp


def create_data_output_holds_other_files(tmp, _):
    (tmp / "corpus").mkdir()
    (tmp / "corpus" / "a.txt").write_text("One sentence. Another one.\n\nA second doc.\n")
    vocab = tmp / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "one"]) + "\n")
    return ["create-pretraining-data", "--input", str(tmp / "corpus"), "--tokenizer",
            str(vocab), "--output-dir", str(tmp / "corpus"), "--num-workers", "1",
            "--no-progress"], tmp


def _vocab(tmp):
    vocab = tmp / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "one"]) + "\n")
    return str(vocab)


def create_data_binary_input(tmp, _):
    (tmp / "random.bin").write_bytes(bytes(range(256)) * 800)
    return ["create-pretraining-data", "--input", str(tmp / "random.bin"), "--tokenizer",
            _vocab(tmp), "--output-dir", str(tmp / "out"), "--num-workers", "1",
            "--no-progress"], tmp


def create_data_folder_mostly_not_text(tmp, _):
    (tmp / "corpus").mkdir()
    (tmp / "corpus" / "a.txt").write_text("One sentence. Another one.\n\nA second doc.\n")
    (tmp / "corpus" / "random.bin").write_bytes(bytes(range(256)) * 800)
    return ["create-pretraining-data", "--input", str(tmp / "corpus"), "--tokenizer",
            _vocab(tmp), "--output-dir", str(tmp / "out"), "--num-workers", "1",
            "--no-progress"], tmp


def _latin1_tokenizer_case(model_type):
    def case(tmp, _):
        (tmp / "latin1.txt").write_bytes("the caf\u00e9 is open\n".encode("latin-1") * 50
                                         + "na\u00efve\n".encode("latin-1") * 10)
        return ["train-tokenizer", "--input", str(tmp / "latin1.txt"), "--output",
                str(tmp / "tok"), "--vocab-size", "40", "--model-type", model_type], tmp

    case.__name__ = f"train_tokenizer_latin1_{model_type.replace('-', '_')}"
    return case


train_tokenizer_latin1_unigram = _latin1_tokenizer_case("unigram")
train_tokenizer_latin1_bpe = _latin1_tokenizer_case("bpe")
train_tokenizer_latin1_wordpiece = _latin1_tokenizer_case("wordpiece")


def _sst2(tmp):
    from tests.finetuning.helpers import write_sst2

    return write_sst2(str(tmp / "SST-2"), n_train=8, n_dev=4)


def _finetune(tmp, model_dir, *overrides, workdir=None, data=None):
    return ["finetune", "--config", "experiments/glue.py:sst2", "--workdir",
            str(workdir or tmp / "ft"), f"--config.init_checkpoint={model_dir}",
            f"--config.data_dir={data or _sst2(tmp)}", "--config.max_seq_length=32", *overrides]


def finetune_zero_batch(tmp, model_dir):
    return _finetune(tmp, model_dir, "--config.global_batch_size=0"), tmp


def finetune_zero_epochs(tmp, model_dir):
    return _finetune(tmp, model_dir, "--config.epochs=0"), tmp


def finetune_zero_eval_batch(tmp, model_dir):
    return _finetune(tmp, model_dir, "--config.eval_batch_size=0"), tmp


def finetune_nan_learning_rate(tmp, model_dir):
    return _finetune(tmp, model_dir, "--config.optimizer.learning_rate=nan"), tmp


def finetune_warmup_proportion_above_one(tmp, model_dir):
    return _finetune(tmp, model_dir, "--config.optimizer.warmup_proportion=2"), tmp


def finetune_unknown_variant(tmp, model_dir):
    return ["finetune", "--config", "experiments/glue.py:mrpcx", "--workdir",
            str(tmp / "ft")], tmp


def finetune_into_pretraining_workdir(tmp, model_dir):
    workdir = _pretraining_workdir(tmp)
    return _finetune(tmp, model_dir, workdir=workdir), workdir


def finetune_into_its_init_checkpoint(tmp, model_dir):
    return _finetune(tmp, model_dir, workdir=model_dir), model_dir


def finetune_score_out_of_range(tmp, model_dir):
    from tests.finetuning.helpers import write_stsb

    sts = write_stsb(str(tmp / "STS-B"), n=6)
    with open(os.path.join(sts, "train.tsv"), "a", encoding="utf-8") as f:
        f.write("6\tmain\tx\t2012\t6\tnone\tnone\tthe cat\tthe dog\t9.5\n")
    return ["finetune", "--config", "experiments/glue.py:stsb", "--workdir", str(tmp / "ft"),
            f"--config.init_checkpoint={model_dir}", f"--config.data_dir={sts}"], tmp


def finetune_non_utf8_tsv(tmp, model_dir):
    data = _sst2(tmp)
    with open(os.path.join(data, "train.tsv"), "ab") as f:
        f.write(b"caf\xe9 au lait\t1\n")
    return _finetune(tmp, model_dir, data=data), tmp


def finetune_header_only_tsv(tmp, model_dir):
    data = _sst2(tmp)
    with open(os.path.join(data, "train.tsv"), encoding="utf-8") as f:
        header = f.readline()
    with open(os.path.join(data, "train.tsv"), "w", encoding="utf-8") as f:
        f.write(header)
    return _finetune(tmp, model_dir, data=data), tmp


def evaluate_pretraining_workdir(tmp, model_dir):
    return ["evaluate", "--workdir", model_dir], model_dir


def evaluate_damaged_checkpoint(tmp, model_dir):
    damaged = _damaged_model(tmp, model_dir)
    return ["evaluate", "--workdir", damaged], damaged


def predict_output_is_a_file(tmp, model_dir):
    (tmp / "pred").write_text("x")
    return ["predict", "--workdir", model_dir, "--output", str(tmp / "pred")], tmp


CASES = [pretrain_zero_batch, pretrain_nan_learning_rate, pretrain_zero_log_every,
         pretrain_zero_eval_every, pretrain_probability_above_one, pretrain_unknown_variant,
         pretrain_other_model_shape, pretrain_into_fine_tuning_workdir,
         pretrain_workdir_is_a_file, pretrain_zero_byte_shard, pretrain_decay_before_warmup,
         pretrain_decay_before_warmup_in_existing_workdir, pretrain_garbage_init_checkpoint,
         pretrain_overwrite_rejected_late, pretrain_checkpoint_of_another_shape,
         fill_mask_zero_top_k,
         fill_mask_negative_top_k, fill_mask_damaged_checkpoint, embed_non_utf8_input,
         fill_mask_input_is_a_directory, embed_output_is_a_directory, embed_damaged_config,
         embed_output_cannot_be_written,
         export_damaged_checkpoint,
         export_output_is_a_file, convert_truncated_safetensors,
         create_data_output_holds_other_files, create_data_binary_input,
         create_data_folder_mostly_not_text, train_tokenizer_latin1_unigram,
         train_tokenizer_latin1_bpe, train_tokenizer_latin1_wordpiece, finetune_zero_batch,
         finetune_zero_epochs,
         finetune_zero_eval_batch, finetune_nan_learning_rate,
         finetune_warmup_proportion_above_one, finetune_unknown_variant,
         finetune_into_pretraining_workdir, finetune_into_its_init_checkpoint,
         finetune_score_out_of_range, finetune_non_utf8_tsv, finetune_header_only_tsv,
         evaluate_pretraining_workdir,
         evaluate_damaged_checkpoint, predict_output_is_a_file]
# What the single error line must name, per case.
EXPECTED = {
    "pretrain_zero_batch": "global_batch_size=0: expected an integer >= 1",
    "pretrain_nan_learning_rate": "optimizer.learning_rate=nan: expected a finite number > 0",
    "pretrain_zero_log_every": "log_every=0",
    "pretrain_zero_eval_every": "eval_every=0",
    "pretrain_probability_above_one": "data.masked_lm_prob=1.5",
    "pretrain_unknown_variant": "unknown variant 'bert_huge'; choose one of",
    "pretrain_other_model_shape": "model.type_vocab_size=2, this config has 3",
    "pretrain_into_fine_tuning_workdir": "holds a fine-tuning run",
    "pretrain_workdir_is_a_file": "exists and is not a directory",
    "pretrain_zero_byte_shard": "train-00001-of-00002.tfrecord: empty (0 bytes)",
    "pretrain_decay_before_warmup": "optimizer.decay_steps=25 must exceed",
    "pretrain_decay_before_warmup_in_existing_workdir": "optimizer.decay_steps=25 must exceed",
    "pretrain_overwrite_rejected_late": "optimizer.decay_steps=25 must exceed",
    "pretrain_checkpoint_of_another_shape": "no usable checkpoint",
    "pretrain_garbage_init_checkpoint": "checksum mismatch",
    "fill_mask_zero_top_k": "--top-k 0: expected an integer >= 1",
    "fill_mask_negative_top_k": "--top-k -3",
    "fill_mask_damaged_checkpoint": "bytes,",
    "embed_non_utf8_input": "in.txt: not utf-8 text (byte offset 12, line 2",
    "fill_mask_input_is_a_directory": "Is a directory",
    "embed_output_is_a_directory": "out.npy: is a directory",
    "embed_output_cannot_be_written": "/proc/x.npy: cannot be written (/proc:",
    "embed_damaged_config": "config.json: not valid JSON",
    "export_damaged_checkpoint": "truncated",
    "export_output_is_a_file": "exists and is not a directory",
    "convert_truncated_safetensors": "model.safetensors: not a readable safetensors file",
    "create_data_output_holds_other_files": "not pretraining data (a.txt)",
    "create_data_binary_input": "random.bin: not utf-8 text (binary: NUL byte at offset 0)",
    "create_data_folder_mostly_not_text": "1 of 2 files found are not utf-8 text",
    "train_tokenizer_latin1_unigram": "latin1.txt: not utf-8 text (byte offset 7, line 1",
    "train_tokenizer_latin1_bpe": "latin1.txt: not utf-8 text (byte offset 7, line 1",
    "train_tokenizer_latin1_wordpiece": "latin1.txt: not utf-8 text (byte offset 7, line 1",
    "finetune_zero_batch": "global_batch_size=0: expected an integer >= 1",
    "finetune_zero_epochs": "epochs=0: expected an integer >= 1",
    "finetune_zero_eval_batch": "eval_batch_size=0",
    "finetune_nan_learning_rate": "optimizer.learning_rate=nan",
    "finetune_warmup_proportion_above_one": "optimizer.warmup_proportion=2.0",
    "finetune_unknown_variant": "mrpcx",
    "finetune_into_pretraining_workdir": "holds a pretraining run, not a fine-tuning run",
    "finetune_into_its_init_checkpoint": "is the init_checkpoint",
    "finetune_score_out_of_range": "train.tsv:8: score '9.5' is outside the task's range",
    "finetune_non_utf8_tsv": "train.tsv: not utf-8 text (byte offset",
    "finetune_header_only_tsv": "SST-2/train.tsv: no train examples (empty, or only a header)",
    "evaluate_pretraining_workdir": "not a fine-tuned workdir",
    "evaluate_damaged_checkpoint": "bytes,",
    "predict_output_is_a_file": "exists and is not a directory",
}


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_one_error_line_and_nothing_touched(case, tmp_path, model_dir, capsys):
    argv, keep = case(tmp_path, model_dir)
    # The whole parent folder: a rejected run leaves no new folder and no changed file.
    watched = [tmp_path, keep, model_dir]
    before = [_snapshot(w) for w in watched]
    rc = main(argv)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert rc == 2, err
    assert len(errors) == 1, err
    assert "Traceback" not in err
    assert EXPECTED[case.__name__] in errors[0], errors[0]
    after = [_snapshot(w) for w in watched]
    for was, now in zip(before, after, strict=True):
        if isinstance(was, dict) and isinstance(now, dict):
            assert sorted(set(was) ^ set(now)) == [], "created or removed"
            assert [k for k in was if was[k] != now[k]] == [], "changed"
        assert was == now
