"""The run's optimizer from the ``optimizer`` section: warmup by steps or by proportion,
decay to the run's last step."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.finetuning.config import base_config
from bert_jax.finetuning.trainer import make_tx


@pytest.mark.parametrize("overrides, warmup", [({}, 10), ({"warmup_proportion": 0.25}, 25),
                                               ({"warmup_steps": 4}, 4)])
def test_warmup_then_linear_decay_over_the_run(overrides, warmup):
    c = base_config()
    c.optimizer.learning_rate = 1e-3
    for key, value in overrides.items():
        c.optimizer[key] = value
    tx, schedule = make_tx(c, total_steps=100)
    assert float(schedule(0)) == 0.0
    assert float(schedule(warmup)) == pytest.approx(1e-3)
    assert float(schedule(warmup - 1)) < 1e-3
    assert float(schedule(100)) == pytest.approx(0.0, abs=1e-12)
    params = {"bert": {"kernel": jnp.ones((2, 2))}}
    updates, _ = tx.update({"bert": {"kernel": jnp.ones((2, 2))}}, tx.init(params), params)
    assert np.all(np.asarray(updates["bert"]["kernel"]) == 0)  # step 0: learning rate 0


def test_decay_steps_and_frozen_encoder():
    c = base_config()
    c.optimizer.warmup_steps = 0
    c.optimizer.decay_steps = 50
    c.optimizer.learning_rate = 1e-2
    c.freeze_encoder = True
    tx, schedule = make_tx(c, total_steps=100)
    assert float(schedule(50)) == pytest.approx(0.0, abs=1e-12)
    params = {"bert": {"kernel": jnp.ones((2, 2))}, "classifier": {"kernel": jnp.ones((2, 2))}}
    updates, _ = tx.update(params, tx.init(params), params)
    assert np.all(np.asarray(updates["bert"]["kernel"]) == 0)
    assert np.all(np.asarray(updates["classifier"]["kernel"]) < 0)
