"""The tqdm progress bars of pretraining and fine-tuning, and what keeps their ETA honest.

tqdm estimates the step rate from the time between its refreshes (smoothed). A run that stops
the steps to evaluate or save a checkpoint would otherwise count that pause as one very slow
stretch of steps, and the ETA would jump (801/2400 at 3.75 s/step, 1:39:48 left, for a run
of 0.05 s steps)."""

from __future__ import annotations


def exclude_pause(progress) -> None:
    """Keeps a pause (evaluation, checkpoint) out of the bar's step rate: the rate is measured
    from the last refresh, so the refresh point moves to now; steps not yet shown count from
    now too. The elapsed time shown still counts the pause."""
    progress.last_print_t = progress._time()
    progress.last_print_n = progress.n
