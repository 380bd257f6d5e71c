"""The training state: one pytree the jitted step consumes (donated) and returns."""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp

# Under ``BertConfig.fp8`` the optimizer-state slot holds {"optimizer": the optimizer's state,
# FP8_STATE: the FP8 scales and amax histories (the model's ``_overwrite_with_gradient``
# collection)}: state that the step replaces, never an optimizer's input, and that the
# checkpoint's ``opt_state`` item saves and restores (fine-tuning and export load ``params``
# only and never see it).
FP8_STATE = "fp8_scaling"


def with_fp8_state(opt_state, fp8_state):
    """The optimizer-state slot holding ``opt_state`` and the FP8 scaling state (``None``:
    ``opt_state`` itself)."""
    if fp8_state is None:
        return opt_state
    return {"optimizer": opt_state, FP8_STATE: fp8_state}


def split_fp8_state(slot) -> tuple[Any, Any]:
    """(optimizer state, FP8 scaling state or None) of an optimizer-state slot."""
    if isinstance(slot, dict) and FP8_STATE in slot:
        return slot["optimizer"], slot[FP8_STATE]
    return slot, None


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
