"""``python -m bert_jax.cli``: the ``bert-jax`` command."""

import sys

from bert_jax.cli import main

sys.exit(main())
