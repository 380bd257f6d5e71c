"""Training checkpoints: Orbax ``CheckpointManager`` over ``WORKDIR/checkpoints/<step>/``.

Items per step (the layout ``bert_jax.checkpoint.store`` reads):
  params       parameter pytree (what fine-tuning and export load)
  opt_state    optimizer state pytree
  train_state  {step, rng, skipped_total, skipped_in_row}
  data_state   the input iterator's JSON state (exact data-stream position)
  digest       content digests of params and opt_state (``bert_jax.checkpoint.digest``),
               committed with the step, so a step killed before its manifest is checkable

Saves are asynchronous (the device->host copy happens before ``save`` returns, the write in
the background) and atomic: Orbax writes ``<step>.orbax-checkpoint-tmp-*`` and renames it to
``<step>`` only when complete, so an interrupted save never hides the previous good step.
Restores take target shardings, so a run resumes onto any mesh or device count.

A state that holds a non-finite value is never saved (:class:`NonFiniteState` names the
first such leaf): every saved step is finite, whatever damaged the state.

Once a save is on disk, process 0 adds ``<step>/sha256.json`` (``integrity``: size and hash
of every file). :meth:`CheckpointManager.restore_latest` restores the newest step that
verifies, restores and holds finite values; a step without a manifest (the process was killed
after Orbax committed it) is trusted only once its arrays match the committed ``digest``, and
then gets its manifest; damaged newer steps are reported and moved to
``WORKDIR/checkpoints.damaged/`` so that the run saves those steps afresh.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import orbax.checkpoint as ocp

from bert_jax import storage
from bert_jax.checkpoint import digest, integrity
from bert_jax.checkpoint.digest import first_non_finite
from bert_jax.checkpoint.store import CHECKPOINTS_DIR, PARAMS_ITEM
from bert_jax.errors import BertJaxError

ITEMS = (PARAMS_ITEM, "opt_state", "train_state", "data_state", digest.DIGEST_ITEM)
DAMAGED_DIR = CHECKPOINTS_DIR + ".damaged"


class NonFiniteState(BertJaxError):
    """The state to save holds NaN or Inf; nothing was saved."""


class CheckpointManager:
    """Periodic, asynchronous, keep-last-K checkpoints of the training state."""

    def __init__(self, workdir: str, *, every_steps: int, keep: int, async_save: bool = True):
        self.directory = storage.join(storage.abspath(workdir), CHECKPOINTS_DIR)
        if every_steps <= 0 or keep <= 0:
            raise BertJaxError(f"checkpoint.every_steps={every_steps} and checkpoint.keep="
                               f"{keep} must be positive")
        self.every_steps = every_steps
        self._unsealed: list[int] = []
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            enable_async_checkpointing=async_save, cleanup_tmp_directories=True, create=False)
        self._manager = ocp.CheckpointManager(self.directory, item_names=ITEMS,
                                              options=options)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, step: int, state, rng: jax.Array, data_state: dict[str, Any],
             force: bool = False) -> bool:
        """Saves if ``step`` is a multiple of ``every_steps`` (or ``force``) and not saved
        yet. Returns whether it saved. Raises :class:`NonFiniteState` (saving nothing) when
        the parameters or optimizer state hold NaN/Inf."""
        if (step % self.every_steps and not force) or step in self._manager.all_steps():
            return False
        leaf = first_non_finite({"params": state.params, "opt_state": state.opt_state})
        if leaf is not None:
            latest = self._manager.latest_step()
            raise NonFiniteState(
                f"step {step}: {leaf} holds NaN/Inf (a damaged parameter or optimizer "
                "moment, or an update that overflowed); not saved. "
                + (f"{self.directory}/{latest} is the newest saved step." if latest is not None
                   else "No step was saved before."))
        self._seal()
        counters = dict(state.counters(), rng=rng)
        digests = digest.compute({"params": state.params, "opt_state": state.opt_state})
        args = ocp.args.Composite(**{
            PARAMS_ITEM: ocp.args.StandardSave(state.params),
            "opt_state": ocp.args.StandardSave(state.opt_state),
            "train_state": ocp.args.StandardSave(counters),
            "data_state": ocp.args.JsonSave(data_state),
            digest.DIGEST_ITEM: ocp.args.JsonSave(digests),
        })
        storage.makedirs(self.directory)  # created with the first save, not before
        saved = self._manager.save(step, args=args, force=True)
        if saved:
            self._unsealed.append(step)
        return saved

    def _seal(self) -> None:
        """Writes the checksum manifest of every step this manager saved, once on disk."""
        if not self._unsealed:
            return
        self._manager.wait_until_finished()
        if jax.process_index() == 0:
            for step in self._unsealed:
                directory = storage.join(self.directory, str(step))
                if storage.isdir(directory):
                    integrity.write_manifest(directory)
        self._unsealed = []

    def restore_latest(self, abstract_state, abstract_rng, log: Callable[[str], None]):
        """(step, state, rng, data_state) of the newest usable step, or None without steps.

        A step whose checksums differ, that fails to restore or holds non-finite values is
        reported through ``log`` and skipped. When an older step restores, the damaged newer
        ones are moved to ``checkpoints.damaged/``; when none does, nothing is moved and a
        BertJaxError lists what failed."""
        failures: list[tuple[int, str]] = []
        for step in sorted(self._manager.all_steps(), reverse=True):
            directory = storage.join(self.directory, str(step))
            try:
                verified = integrity.verify(directory)
                state, rng, data_state = self.restore(step, abstract_state, abstract_rng)
                arrays = {"params": state.params, "opt_state": state.opt_state}
                leaf = first_non_finite(arrays)
                if leaf is not None:
                    raise integrity.DamagedCheckpoint(f"{directory}: {leaf} holds NaN/Inf")
                if not verified:
                    self._verify_unsealed(directory, arrays)
            except Exception as e:  # Orbax/tensorstore errors for truncated/missing files
                reason = integrity.describe_failure(directory, e)
                log(f"warning: checkpoint step {step} is damaged and skipped: {reason}")
                failures.append((step, reason))
                continue
            if failures:
                self._set_aside([s for s, _ in failures])
                log(f"resuming from step {step}, the newest complete checkpoint; the damaged "
                    f"steps {[s for s, _ in failures]} are in "
                    f"{storage.join(storage.dirname(self.directory), DAMAGED_DIR)}")
            return step, state, rng, data_state
        if failures:
            raise BertJaxError(
                f"{self.directory}: no usable checkpoint ({'; '.join(r for _, r in failures)})."
                " If the config changed, rerun with the config the run was started with; to "
                "start afresh, move the checkpoints directory away")
        return None

    def _verify_unsealed(self, directory: str, arrays) -> None:
        """A step without its manifest (killed after Orbax committed it): its restored arrays
        must match the digests committed with it; then it gets its manifest."""
        recorded = digest.read(directory)
        if recorded is not None:
            leaf = digest.first_mismatch(recorded, arrays)
            if leaf is not None:
                raise integrity.DamagedCheckpoint(
                    f"{directory}: {leaf} differs from when saved (content digest mismatch)")
        if jax.process_index() == 0:
            integrity.write_manifest(directory)

    def _set_aside(self, steps: list[int]) -> None:
        if jax.process_index() == 0:
            target = storage.join(storage.dirname(self.directory), DAMAGED_DIR)
            storage.makedirs(target)
            for step in steps:
                destination = storage.join(target, str(step))
                suffix = 0
                while storage.exists(destination):
                    suffix += 1
                    destination = storage.join(target, f"{step}.{suffix}")
                storage.move_tree(storage.join(self.directory, str(step)), destination)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("bert_jax_checkpoints_set_aside")
        self._manager.reload()

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
        """Blocks until the pending asynchronous save is on disk (with its manifest)."""
        self._manager.wait_until_finished()
        self._seal()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._seal()
        self._manager.close()
