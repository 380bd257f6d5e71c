"""Packed rows (``bert_jax.data.packing``) train the family objectives: a packed batch gives
every example the losses it gets unpacked (SpanBERT's MLM + SBO, ELECTRA's generator MLM +
RTD, DistilBERT's MLM + KD + cosine), the span boundaries stay inside each example, and
``build_training`` trains each objective on rows from ``create-pretraining-data --pack``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import parallel
from bert_jax.checkpoint import store
from bert_jax.cli import main
from bert_jax.config import get_preset
from bert_jax.data import packing
from bert_jax.modeling import family, heads
from bert_jax.modeling.heads import BertForPreTraining
from bert_jax.tokenization import load_tokenizer
from bert_jax.training import config as config_lib
from bert_jax.training import objectives
from bert_jax.training.config import load_config
from bert_jax.training.inputs import make_batches
from bert_jax.training.setup import PACKED_BATCH_FIELDS, build_training

from .helpers import EXPERIMENT, SMALL, random_params, without_keys

SEQ, K, P_EXAMPLE, P_ROW = 32, 4, 4, 12
CLS, SEP, MASK = 2, 3, 4
# Two-segment examples ([CLS] a [SEP] b [SEP]) of these lengths, and in each a masked run of
# two tokens and a single masked token, none next to a [CLS] or [SEP].
LENGTHS = (12, 9, 8, 14, 10, 11)
CFG = get_preset("tiny", vocab_size=200, hidden_size=32, num_attention_heads=4,
                 intermediate_size=64, num_hidden_layers=1, max_position_embeddings=SEQ,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _examples(seed=0):
    """Unpacked right-padded examples with their masked-LM inputs, and ``target`` [N, SEQ]
    (the masked token's id + 1 at each masked position, 0 elsewhere) to pack them by."""
    rng = np.random.default_rng(seed)
    n = len(LENGTHS)
    ids = np.zeros((n, SEQ), np.int32)
    segments = np.zeros((n, SEQ), np.int32)
    positions = np.zeros((n, P_EXAMPLE), np.int32)
    weights = np.zeros((n, P_EXAMPLE), np.float32)
    for e, length in enumerate(LENGTHS):
        split = length // 2
        ids[e, :length] = rng.integers(5, CFG.vocab_size, length)
        ids[e, [0, split, length - 1]] = CLS, SEP, SEP
        segments[e, split + 1:length] = 1
        masked = [2, 3, length - 3]
        positions[e, :3] = masked
        weights[e, :3] = 1
    mask = (np.arange(SEQ)[None] < np.array(LENGTHS)[:, None]).astype(np.int32)
    labels = np.take_along_axis(ids, positions, 1) * (weights > 0)
    target = np.zeros_like(ids)
    np.put_along_axis(target, positions, (labels + 1) * (weights > 0), 1)
    masked_ids = np.where(target > 0, MASK, ids)
    return {"input_ids": masked_ids, "input_mask": mask, "segment_ids": segments,
            "masked_lm_positions": positions, "masked_lm_ids": labels.astype(np.int32),
            "masked_lm_weights": weights, "target": target}


def _packed(feats):
    """The examples packed into rows, with each row's masked positions in token order."""
    rows = packing.pack_lengths(np.array(LENGTHS), SEQ, K, seed=0)
    assert len(rows) < len(LENGTHS)  # some rows hold several examples
    packed = packing.pack_features(feats, rows, K,
                                   token_keys=("input_ids", "segment_ids", "target"))
    positions = np.zeros((len(rows), P_ROW), np.int32)
    ids = np.zeros((len(rows), P_ROW), np.int32)
    weights = np.zeros((len(rows), P_ROW), np.float32)
    for r, target in enumerate(packed.pop("target")):
        hit = np.flatnonzero(target)
        positions[r, :len(hit)] = hit
        ids[r, :len(hit)] = target[hit] - 1
        weights[r, :len(hit)] = 1
    packed.update(masked_lm_positions=positions, masked_lm_ids=ids, masked_lm_weights=weights)
    return packed


def _jnp(batch):
    return {k: jnp.asarray(v) for k, v in batch.items() if k != "target"}


def _per_example(values, batch, per_token: bool):
    """[N] sums per example of per-prediction ([rows, P], weighted) or per-token ([rows,
    SEQ], real tokens) values, unpacked (one example a row) or packed (by example slot)."""
    values = np.asarray(values, np.float64)
    if per_token:
        weights = np.asarray(batch["input_mask"], np.float64)
        slots = np.asarray(batch.get("example_ids", batch["input_mask"]))
    else:
        weights = np.asarray(batch["masked_lm_weights"], np.float64)
        ids = np.asarray(batch.get("example_ids", batch["input_mask"]))
        slots = np.take_along_axis(ids, np.asarray(batch["masked_lm_positions"]), 1)
    if "example_index" not in batch:
        return (values * weights).sum(1)
    owner = np.take_along_axis(np.asarray(batch["example_index"]), np.maximum(slots - 1, 0), 1)
    out = np.zeros(len(LENGTHS))
    np.add.at(out, owner[weights > 0], (values * weights)[weights > 0])
    return out


def _mlm_nll(out, batch, cfg, decoder="mlm_decoder", logits="mlm_logits"):
    return heads.mlm_cross_entropy({"mlm_decoder": out[decoder], "mlm_logits": out[logits]},
                                   batch["masked_lm_ids"], cfg)[0]


def _sbo():
    model = family.SpanBertForPreTraining(CFG, max_relative_position=8)

    def init(b):
        return random_params(model, b["input_ids"], b["input_mask"], b["segment_ids"],
                              b["masked_lm_positions"], b["masked_lm_weights"])

    def terms(params, b):
        out = model.apply({"params": params}, b["input_ids"], b["input_mask"],
                          b["segment_ids"], b["masked_lm_positions"], b["masked_lm_weights"],
                          **heads.packing_inputs(b))
        return {"mlm": (_mlm_nll(out, b, CFG), False),
                "sbo": (_mlm_nll(out, b, CFG, "sbo_decoder", "sbo_logits"), False)}

    return init, terms, objectives.span_boundary_sums(model)


def _electra():
    model = family.ElectraForPreTraining(CFG, family.generator_config(CFG, 0.5))

    def init(b):
        params = family.untie_generator_embeddings(random_params(
            model, b["input_ids"], b["input_mask"], b["segment_ids"],
            b["masked_lm_positions"], b["masked_lm_ids"], b["masked_lm_weights"],
            jax.random.PRNGKey(0)))
        # A generator that samples token 7 wherever it predicts, whatever the layout: both
        # layouts give the discriminator the same corrupted tokens.
        bias = params["generator_mlm"]["bias"].at[7].set(1e4)
        return params, {**params, "generator_mlm": {**params["generator_mlm"], "bias": bias}}

    def apply(params, b):
        return model.apply({"params": family.tie_generator_embeddings(params)},
                           b["input_ids"], b["input_mask"], b["segment_ids"],
                           b["masked_lm_positions"], b["masked_lm_ids"],
                           b["masked_lm_weights"], jax.random.PRNGKey(3),
                           **heads.packing_inputs(b))

    def terms(params, b):
        natural, peaked = params
        out = apply(peaked, b)
        rtd, _ = objectives.rtd_loss(out["rtd_logits"], out["rtd_labels"])
        return {"generator_mlm": (_mlm_nll(apply(natural, b), b, model.generator), False),
                "rtd": (rtd, True), "replaced": (out["rtd_labels"], True)}

    sums_fn = objectives.electra_sums(model, rtd_weight=50.0)
    # the objective's sums with the generator whose samples do not depend on the layout
    return init, terms, lambda params, *args: sums_fn(params[1], *args)


def _distill():
    model = family.DistillationPair(CFG, CFG.replace(num_hidden_layers=2))

    def init(b):
        return random_params(model, b["input_ids"], b["input_mask"], b["segment_ids"],
                              b["masked_lm_positions"])

    def terms(params, b):
        out = model.apply({"params": params}, b["input_ids"], b["input_mask"],
                          b["segment_ids"], b["masked_lm_positions"],
                          **heads.packing_inputs(b))
        kd = objectives.kd_loss(out["mlm_logits"], out["teacher_mlm_logits"], 2.0)
        cos = objectives.cosine_loss(out["sequence_output"], out["teacher_sequence_output"])
        return {"mlm": (_mlm_nll(out, b, CFG), False), "kd": (kd, False), "cos": (cos, True)}

    return init, terms, objectives.distill_sums(model, 2.0, 2.5, 0.5)


@pytest.mark.parametrize("objective", [_sbo, _electra, _distill],
                         ids=["sbo", "electra", "distill"])
def test_packed_rows_give_each_example_its_unpacked_losses(objective):
    feats = _examples()
    unpacked, packed = _jnp(feats), _jnp(_packed(feats))
    init, terms, sums_fn = objective()
    params = init(unpacked)

    @jax.jit
    def run(batch):  # the per-prediction / per-token terms, and the objective's sums
        return terms(params, batch), sums_fn(params, batch, jax.random.PRNGKey(5), True)

    (alone, sums), (together, packed_sums) = run(unpacked), run(packed)
    for name, (values, per_token) in alone.items():
        expected = _per_example(values, unpacked, per_token)
        got = _per_example(together[name][0], packed, per_token)
        assert np.all(expected != 0), name
        np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5, err_msg=name)
    assert set(sums) == set(packed_sums)
    for key in sums:
        np.testing.assert_allclose(packed_sums[key], sums[key], rtol=2e-5, atol=2e-5,
                                   err_msg=key)


def test_span_boundaries_stay_inside_each_example():
    # Examples 1 (positions 0-3) and 2 (4-7), padding after. Masked: 2, 3 (the end of example
    # 1), 4 (the start of example 2) and 6; the padded prediction has weight 0.
    example_ids = jnp.array([[1, 1, 1, 1, 2, 2, 2, 2, 0, 0]])
    positions = jnp.array([[2, 3, 4, 6, 0]])
    weights = jnp.array([[1.0, 1, 1, 1, 0]])
    left, right, offset = family.span_boundaries(positions, weights, 10, example_ids)
    np.testing.assert_array_equal(left[0, :4], [1, 1, 4, 5])
    np.testing.assert_array_equal(right[0, :4], [3, 3, 5, 7])
    np.testing.assert_array_equal(offset[0, :4], [1, 2, 0, 1])
    # Unpacked, 2-4 is one run between 1 and 5; a run at the row's edges stops there.
    left, right, offset = family.span_boundaries(positions, weights, 10)
    np.testing.assert_array_equal(left[0, :4], [1, 1, 1, 5])
    np.testing.assert_array_equal(right[0, :4], [5, 5, 5, 7])
    left, right, offset = family.span_boundaries(jnp.array([[0, 9]]), jnp.ones((1, 2)), 10)
    np.testing.assert_array_equal(left[0], [0, 8])
    np.testing.assert_array_equal(right[0], [1, 9])


@pytest.fixture(scope="module")
def packed_data(tmp_path_factory):
    """``create-pretraining-data --pack`` rows (64 tokens, up to 4 examples), its vocab, and
    a 1-layer teacher model directory for ``distill`` (the 1-layer student starts as its
    copy)."""
    pytest.importorskip("tensorflow")
    from data.helpers import write_corpus, write_vocab

    tmp = tmp_path_factory.mktemp("packed")
    write_corpus(tmp / "corpus", n_files=1, docs_per_file=8)
    vocab = write_vocab(str(tmp))
    out = tmp / "data"
    assert main(["create-pretraining-data", "--input", str(tmp / "corpus"), "--tokenizer",
                 vocab, "--output-dir", str(out), "--max-seq-length", "64",
                 "--short-seq-prob", "0.7", "--num-shards", "1", "--num-workers", "1",
                 "--pack", "--max-examples-per-row", "4", "--no-progress"]) == 0
    teacher_cfg = get_preset("tiny", vocab_size=39, hidden_size=32, num_attention_heads=4,
                             intermediate_size=64, num_hidden_layers=1,
                             max_position_embeddings=64)
    teacher = BertForPreTraining(teacher_cfg, pair_head=False)
    store.save_model(str(tmp / "teacher"), jax.device_get(
        random_params(teacher, *[jnp.zeros((1, 8), jnp.int32)] * 3)), teacher_cfg)
    return str(out), vocab, str(tmp / "teacher")


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["sbo", "distill"])
def test_build_training_trains_packed_rows(packed_data, objective):
    """The pipeline's packed batches (SpanBERT's masked as spans) through one train step
    (ELECTRA's packed sums: the equality test above; its generator and discriminator take
    the packing inputs as SpanBERT's encoder does); SpanBERT's loss then falls over five
    more steps."""
    data, vocab, teacher = packed_data
    overrides = {"sbo": ["--config.data.masking=span", "--config.optimizer.warmup_steps=0",
                         "--config.optimizer.learning_rate=3e-3"],
                 "distill": [f"--config.distill.teacher={teacher}"]}[objective]
    settings = [f"--config.objective={objective}", f"--config.data.directory={data}",
                f"--config.data.tokenizer={vocab}", "--config.data.source=tfrecord",
                "--config.model.vocab_size=39", "--config.model.num_hidden_layers=1",
                "--config.data.max_seq_length=64", "--config.model.max_position_embeddings=64",
                "--config.global_batch_size=4", "--config.data.shuffle_buffer=1",
                "--config.model.hidden_dropout_prob=0.0",
                "--config.model.attention_probs_dropout_prob=0.0", *overrides]
    config = load_config(f"{EXPERIMENT}:tiny", [*without_keys(SMALL, settings), *settings])
    mesh = parallel.create_mesh({"data": -1}, devices=jax.devices()[:1])
    training = build_training(config, config_lib.model_config(config), mesh)
    assert {name for name, _ in PACKED_BATCH_FIELDS} <= set(training.batch_shardings)
    state = training.init_state(jax.random.PRNGKey(0))
    if training.init_params is not None:
        state = state.replace(params=training.init_params(state.params,
                                                          training.state_shardings.params))
    batches = make_batches(config, "train", batch_size=4, vocab_size=39, process_index=0,
                           process_count=1, tokenizer=load_tokenizer(vocab))
    batch = next(batches)
    assert batch["next_sentence_weights"].sum() > 4  # several examples a row
    state, metrics = training.train_step(state, training.global_batch(batch),
                                         jax.random.PRNGKey(1))
    assert int(state.step) == 1 and not int(metrics["skipped"])
    if objective == "sbo":  # SpanBERT trains: the loss falls over a few steps on this batch
        losses = [float(metrics["loss"])]
        for _ in range(5):
            state, more = training.train_step(state, training.global_batch(batch),
                                              jax.random.PRNGKey(1))
            losses.append(float(more["loss"]))
        assert np.isfinite(losses).all() and losses[-1] < 0.95 * losses[0], losses
    assert np.isfinite(float(metrics["loss"])) and float(metrics["mlm_loss"]) > 0
    assert float(metrics["nsp_loss"]) == 0
    if objective == "distill":  # the student, a copy of the teacher, reads rows as it does
        assert float(metrics["kd_loss"]) < 1e-6 and float(metrics["cos_loss"]) < 1e-6
    else:
        assert float(metrics["sbo_loss"]) > 0
