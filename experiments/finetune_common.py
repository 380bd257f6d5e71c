"""The fine-tuning experiment helpers under the name experiments/e2e.py imports them by; they
live in ``bert_jax.tasks.recipes`` (glue.py, squad.py, ner.py and swag.py import them from
there)."""

from bert_jax.tasks.recipes import make_quick, split_variant, task_config

__all__ = ["make_quick", "split_variant", "task_config"]
