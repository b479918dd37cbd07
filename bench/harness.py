"""What bench/'s timing scripts share: a clock over repeats, a child process's peak memory, a
Trainer callback that times optimizer steps, and the one JSON line a script ends with.

Not a script. The scripts run as files from the repo root, `.venv/bin/python bench/<name>.py`:
Python then puts the script's folder, bench/, first on sys.path, which is how they find this
module (`import harness`), and rarelm comes from the venv's editable install. `python -P` leaves
bench/ off sys.path, so a script that imports this module does not run under -P.

>>> seconds, value = timed(lambda: sum(range(1000)))
>>> value, seconds >= 0
(499500, True)
>>> best_of(3, lambda: None) >= 0
True
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from typing import Any


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Wall seconds of one call of `fn` (time.perf_counter), and what it returned."""
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def best_of(repeats: int, fn: Callable[[], Any]) -> float:
    """The fastest of `repeats` calls of `fn`, in seconds: the run least disturbed by other load
    on a shared machine."""
    return min(timed(fn)[0] for _ in range(repeats))


def run_with_peak_rss(argv: list[str], name: str) -> tuple[str, float]:
    """Run `argv` as a child process; its stdout and its peak memory (max RSS, MB, from wait4), so
    that a measurement run in its own process reports its own peak alone. Raises SystemExit,
    naming the child `name`, when it fails."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    stdout = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"{name} failed with status {status}")
    return stdout, usage.ru_maxrss / 1024


def trainer_clock(warmup: int, sync: Callable[[], None] = lambda: None):
    """A transformers TrainerCallback that starts its clock at the end of optimizer step `warmup`
    and counts the steps after it; `clock.tokens_per_s(tokens_per_step)` once training is over.
    `sync` runs before each reading of the clock (a CUDA device's synchronize)."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self):
            self.t0, self.steps = None, 0

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == warmup:
                sync()
                self.t0 = time.perf_counter()
            elif state.global_step > warmup:
                self.steps += 1

        def tokens_per_s(self, tokens_per_step: int) -> float:
            sync()
            return self.steps * tokens_per_step / (time.perf_counter() - self.t0)

    return StepClock()


def print_json(result: dict) -> None:
    """The script's last line: one JSON object."""
    print(json.dumps(result), flush=True)
