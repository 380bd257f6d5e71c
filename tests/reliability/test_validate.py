"""Every number of a pretraining or fine-tuning config is range-checked when the config is
loaded, and the error names the key and the allowed range."""

import pytest

from bert_jax.errors import BertJaxError
from bert_jax.training.config import load_config
from tests.training.helpers import EXPERIMENT, SMALL

BAD = [
    ("global_batch_size=-4", "global_batch_size=-4: expected an integer >= 1"),
    ("microbatches=-1", "microbatches=-1: expected an integer >= 0"),
    ("microbatches=3", "global_batch_size=16: expected a multiple of microbatches=3"),
    ("num_train_steps=0", "num_train_steps=0: expected an integer >= 1"),
    ("optimizer.learning_rate=0", "optimizer.learning_rate=0.0: expected a finite number > 0"),
    ("optimizer.learning_rate=inf", "optimizer.learning_rate=inf: expected a finite number"),
    ("optimizer.b2=1.0", "optimizer.b2=1.0: expected a finite number >= 0 and < 1"),
    ("optimizer.eps=-1e-6", "optimizer.eps=-1e-06"),
    ("optimizer.warmup_steps=-1", "optimizer.warmup_steps=-1"),
    ("optimizer.decay_steps=0", "optimizer.decay_steps=0: expected an integer >= 1 (or -1)"),
    ("optimizer.decay=cosin", "optimizer.decay='cosin': expected one of linear"),
    ("optimizer.clip_norm=nan", "optimizer.clip_norm=nan"),
    ("data.masked_lm_prob=0", "data.masked_lm_prob=0.0: expected a finite number > 0 and <= 1"),
    ("data.wait_timeout_s=-1", "data.wait_timeout_s=-1.0"),
    ("data.mask_token_fraction=1.5",
     "data.mask_token_fraction=1.5: expected a finite number >= 0 and <= 1"),
    ("data.random_token_fraction=-0.1", "data.random_token_fraction=-0.1"),
    ("data.random_token_fraction=0.3",
     "data.mask_token_fraction=0.8 + data.random_token_fraction=0.3: expected a sum <= 1"),
    ("data.shuffle_buffer=0", "data.shuffle_buffer=0"),
    ("parallel.mesh.fsdp=0", "parallel.mesh.fsdp=0: expected an integer >= 1 (or -1)"),
    ("checkpoint.every_steps=0", "checkpoint.every_steps=0"),
    ("checkpoint.keep=0", "checkpoint.keep=0"),
    ("log_every=0", "log_every=0"),
    ("eval_every=-5", "eval_every=-5"),
    ("eval_steps=-1", "eval_steps=-1: expected an integer >= 0"),
    ("max_skipped_in_row=0", "max_skipped_in_row=0"),
    ("peak_tflops=0", "peak_tflops=0.0"),
    ("profile_steps=(5, 2)", "profile_steps=(5, 2): expected () or (first, last)"),
    ("model.hidden_dropout_prob=1.5", "model.hidden_dropout_prob=1.5"),
    ("model.layer_norm_eps=0", "model.layer_norm_eps=0.0"),
    ("objective=mlm2", "objective='mlm2': expected one of nsp, sop, mlm"),
]


@pytest.mark.parametrize("override,message", BAD, ids=[b[0] for b in BAD])
def test_out_of_range_value_names_key_and_range(override, message):
    key = override.split("=")[0]
    base = [a for a in SMALL if not a.startswith(f"--config.{key}=")]
    with pytest.raises(BertJaxError) as error:
        load_config(f"{EXPERIMENT}:tiny", [*base, f"--config.{override}"])
    assert message in str(error.value)


def test_every_shipped_variant_is_valid():
    from experiments.pretrain import VARIANTS

    for variant in VARIANTS:
        load_config(f"{EXPERIMENT}:{variant}")


FINETUNE_BAD = [
    ("global_batch_size=0", "global_batch_size=0: expected an integer >= 1"),
    ("eval_batch_size=-1", "eval_batch_size=-1: expected an integer >= 1"),
    ("epochs=0", "epochs=0: expected an integer >= 1"),
    ("log_every=-1", "log_every=-1: expected an integer >= 0"),
    ("max_seq_length=4", "max_seq_length=4: expected an integer >= 8"),
    ("holdout_fraction=1.0", "holdout_fraction=1.0: expected a finite number >= 0 and < 1"),
    ("optimizer.learning_rate=-2e-5", "optimizer.learning_rate=-2e-05"),
    ("optimizer.warmup_proportion=1.5", "optimizer.warmup_proportion=1.5"),
    ("optimizer.warmup_steps=-2", "optimizer.warmup_steps=-2: expected an integer >= 0 (or -1)"),
    ("parallel.mesh.data=0", "parallel.mesh.data=0"),
    ("on_error=ignore", "on_error='ignore': expected one of raise, skip"),
    ("model.attention_probs_dropout_prob=-0.1", "model.attention_probs_dropout_prob=-0.1"),
]


@pytest.mark.parametrize("override,message", FINETUNE_BAD, ids=[b[0] for b in FINETUNE_BAD])
def test_fine_tuning_value_names_key_and_range(override, message):
    from bert_jax.finetuning.config import load_config as load_finetune_config

    with pytest.raises(BertJaxError) as error:
        load_finetune_config("experiments/glue.py:mrpc", [f"--config.{override}"])
    assert message in str(error.value)


def test_every_shipped_fine_tuning_variant_is_valid():
    from bert_jax.finetuning.config import load_config as load_finetune_config

    for name, variants in (("glue", ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli",
                                     "rte", "wnli", "sst2_quick")),
                           ("squad", ("v1", "v2")), ("ner", ("conll2003",)),
                           ("swag", ("swag",))):
        for variant in variants:
            load_finetune_config(f"experiments/{name}.py:{variant}")
