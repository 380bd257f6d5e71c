"""The training state: one pytree the jitted step consumes (donated) and returns."""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class TrainState:
    """Parameters, optimizer state and counters.

    ``skipped_total`` counts updates dropped for a non-finite loss or gradient and
    ``skipped_in_row`` the current streak. The dropout key is not part of the state: the step
    derives it as ``fold_in(rng, step)`` from the run's base key, so the random stream depends
    only on (seed, step) and a resumed run replays it exactly.
    """

    step: jax.Array  # int32 scalar: updates attempted so far (skipped ones included)
    params: Any
    opt_state: Any
    skipped_total: jax.Array  # int32 scalar
    skipped_in_row: jax.Array  # int32 scalar

    @classmethod
    def create(cls, params, opt_state) -> TrainState:
        zero = jnp.zeros((), jnp.int32)
        return cls(step=zero, params=params, opt_state=opt_state, skipped_total=zero,
                   skipped_in_row=zero)

    def counters(self) -> dict[str, Any]:
        """The small non-parameter part (saved in checkpoint item ``train_state``)."""
        return {"step": self.step, "skipped_total": self.skipped_total,
                "skipped_in_row": self.skipped_in_row}
