"""The progress bar's ETA leaves evaluation and checkpoint pauses out."""

import io

from tqdm import tqdm

from bert_jax.runs.progress import exclude_pause


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _bar(clock):
    bar = tqdm(total=2400, file=io.StringIO(), mininterval=0, miniters=1)
    bar._time = clock  # tqdm reads its clock through this attribute
    bar.start_t = bar.last_print_t = clock()
    return bar


def _run(exclude: bool) -> dict:
    clock = Clock()
    bar = _bar(clock)
    for _ in range(800):  # 0.05 s a step
        clock.now += 0.05
        bar.update(1)
    clock.now += 180.0  # a three-minute evaluation
    if exclude:
        exclude_pause(bar)
    for _ in range(5):
        clock.now += 0.05
        bar.update(1)
    meter = bar.format_dict
    bar.close()
    rate = meter["rate"] or meter["n"] / meter["elapsed"]
    return {"rate": rate, "remaining": (meter["total"] - meter["n"]) / rate,
            "elapsed": meter["elapsed"]}


def test_a_pause_leaves_the_rate_and_eta_alone():
    kept = _run(exclude=True)
    assert abs(kept["rate"] - 20.0) < 0.5  # steps per second
    assert abs(kept["remaining"] - 1595 / 20) < 3
    assert abs(kept["elapsed"] - (805 * 0.05 + 180)) < 1e-6  # wall time still shown
    # Without it, the pause reads as slow steps: the ETA the user saw jump.
    jumped = _run(exclude=False)
    assert jumped["remaining"] > 10 * kept["remaining"]
