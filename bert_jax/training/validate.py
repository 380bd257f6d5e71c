"""Range checks of every number in a pretraining config, run when the config is loaded.

A bad value stops the run before anything is compiled or written, with one message naming
the key and the allowed range (``global_batch_size=0: expected an integer >= 1``). The
checks that need the devices (the batch split over the mesh) run in the loop's setup, still
before compilation.
"""

from __future__ import annotations

from bert_jax.errors import BertJaxError
from bert_jax.validation import Checker, check_mesh, check_model, check_optimizer

# The pretraining objectives (training/config.py reads them from here) and data sources
# (auto: picked from what data.directory holds; training/inputs.py).
OBJECTIVES = ("nsp", "sop", "mlm", "sbo", "electra", "distill")
DATA_SOURCES = ("auto", "tfrecord", "materialized", "synthetic")


def validate_pretraining(config) -> None:
    """BertJaxError naming the first out-of-range value of a pretraining ConfigDict."""
    c = Checker(config)
    c.choice("objective", OBJECTIVES)
    c.choice("data.source", DATA_SOURCES)
    c.integer("data.max_seq_length", 8)
    c.integer("data.max_predictions_per_seq", 1)
    c.probability("data.masked_lm_prob", zero=False)
    shown = c.probability("data.mask_token_fraction")
    random = c.probability("data.random_token_fraction")
    if shown + random > 1.0:
        raise BertJaxError(f"data.mask_token_fraction={shown} + data.random_token_fraction="
                           f"{random}: expected a sum <= 1 (the rest stay unchanged)")
    c.integer("data.shuffle_buffer", 1)
    c.integer("data.seed", 0)
    c.number("data.wait_timeout_s", 0.0)
    if "short_seq_prob" in config.data:
        c.probability("data.short_seq_prob")
    if "max_examples_per_row" in config.data:
        c.integer("data.max_examples_per_row", 0)
    batch = c.integer("global_batch_size", 1)
    micro = c.integer("microbatches", 0)  # 0: auto (setup.fit_microbatches)
    if micro and batch % micro:
        raise BertJaxError(f"global_batch_size={batch}: expected a multiple of "
                           f"microbatches={micro}")
    c.integer("num_train_steps", 1)
    c.integer("seed", 0)
    check_optimizer(c)
    check_mesh(c, "parallel.mesh", config)
    check_mesh(c, "parallel.dcn_mesh", config)
    c.integer("checkpoint.every_steps", 1)
    c.integer("checkpoint.keep", 1)
    c.integer("log_every", 1)
    c.integer("eval_every", 1)
    c.integer("eval_steps", 0)
    c.integer("max_skipped_in_row", 1)
    c.number("peak_tflops", 0.0, low_open=True, optional=True)
    profile = tuple(config.profile_steps)
    if profile and (len(profile) != 2 or not all(isinstance(s, int) for s in profile)
                    or not 0 <= profile[0] < profile[1]):
        raise BertJaxError(f"profile_steps={profile!r}: expected () or (first, last) with "
                           "0 <= first < last")
    check_model(c, config)
