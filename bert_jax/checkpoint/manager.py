"""Training checkpoints: Orbax ``CheckpointManager`` over ``WORKDIR/checkpoints/<step>/``.

Items per step (the layout ``bert_jax.checkpoint.store`` reads):
  params       parameter pytree (what fine-tuning and export load)
  opt_state    optimizer state pytree
  train_state  {step, rng, skipped_total, skipped_in_row}
  data_state   the input iterator's JSON state (exact data-stream position)

Saves are asynchronous (the device->host copy happens before ``save`` returns, the write in
the background) and atomic: Orbax writes ``<step>.orbax-checkpoint-tmp-*`` and renames it to
``<step>`` only when complete, so an interrupted save never hides the previous good step.
Restores take target shardings, so a run resumes onto any mesh or device count.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from bert_jax.checkpoint.store import CHECKPOINTS_DIR, PARAMS_ITEM
from bert_jax.errors import BertJaxError

ITEMS = (PARAMS_ITEM, "opt_state", "train_state", "data_state")


class CheckpointManager:
    """Periodic, asynchronous, keep-last-K checkpoints of the training state."""

    def __init__(self, workdir: str, *, every_steps: int, keep: int, async_save: bool = True):
        self.directory = os.path.join(os.path.abspath(workdir), CHECKPOINTS_DIR)
        if every_steps <= 0 or keep <= 0:
            raise BertJaxError(f"checkpoint.every_steps={every_steps} and checkpoint.keep="
                               f"{keep} must be positive")
        self.every_steps = every_steps
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            enable_async_checkpointing=async_save, cleanup_tmp_directories=True, create=True)
        self._manager = ocp.CheckpointManager(self.directory, item_names=ITEMS,
                                              options=options)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, step: int, state, rng: jax.Array, data_state: dict[str, Any],
             force: bool = False) -> bool:
        """Saves if ``step`` is a multiple of ``every_steps`` (or ``force``) and not saved
        yet. Returns whether it saved."""
        if (step % self.every_steps and not force) or step in self._manager.all_steps():
            return False
        counters = dict(state.counters(), rng=rng)
        args = ocp.args.Composite(**{
            PARAMS_ITEM: ocp.args.StandardSave(state.params),
            "opt_state": ocp.args.StandardSave(state.opt_state),
            "train_state": ocp.args.StandardSave(counters),
            "data_state": ocp.args.JsonSave(data_state),
        })
        return self._manager.save(step, args=args, force=True)

    def restore(self, step: int, abstract_state, abstract_rng):
        """Restores (state, rng, data_state) onto the shardings carried by the abstract
        trees (``jax.ShapeDtypeStruct`` with ``sharding``), whatever mesh saved them."""
        counters = dict(abstract_state.counters(), rng=abstract_rng)
        args = ocp.args.Composite(**{
            PARAMS_ITEM: ocp.args.StandardRestore(abstract_state.params),
            "opt_state": ocp.args.StandardRestore(abstract_state.opt_state),
            "train_state": ocp.args.StandardRestore(counters),
            "data_state": ocp.args.JsonRestore(),
        })
        restored = self._manager.restore(step, args=args)
        counters = dict(restored["train_state"])
        rng = counters.pop("rng")
        state = abstract_state.replace(params=restored[PARAMS_ITEM],
                                       opt_state=restored["opt_state"], **counters)
        return state, rng, restored["data_state"]

    def wait(self) -> None:
        """Blocks until the pending asynchronous save is on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
