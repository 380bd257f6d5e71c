"""The fine-tuning machinery every task shares: the run config, the task model and its jitted
steps (``trainer``), length buckets and packed rows, the starting model, the loop
(``finetune(config, workdir)``), evaluation and prediction, task distillation. The tasks
themselves (readers, features, metrics) are in ``bert_jax.tasks``."""
