"""Progress of long stages as log lines on stderr, for logs and pipes where no progress bar shows.

A rich bar is drawn only on a terminal, and erased when done; `dvc repro > log` or a queued
experiment's log saw minutes of nothing. These print plain lines instead:

    steps = Steps("rare_terms")
    steps.done("counting tokens")   # rare_terms: counting tokens 3.1 s (15.0 s so far)
    advance = ticker("evaluate: test scoring tokens", total=5000)
    advance(100)                    # every 30 s: evaluate: test scoring tokens 1,200/5,000 (24%),
                                    #   1 min 35 s, about 5 min 0 s left
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable


def duration(seconds: float) -> str:
    """Seconds as a person reads them.

    >>> duration(5.04), duration(95), duration(3725)
    ('5.0 s', '1 min 35 s', '1 h 02 min')
    """
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def eta(elapsed: float, done: int, total: int) -> str:
    """`about 5 min 0 s left` at the rate so far; "" before anything is done.

    >>> eta(60.0, 100, 600)
    'about 5 min 0 s left'
    """
    if done <= 0 or total <= done:
        return ""
    return f"about {duration(elapsed / done * (total - done))} left"


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Steps:
    """One line as each step of a stage ends, its time and the stage's time so far, once the stage
    has run `quiet` seconds: a stage done in seconds (a small corpus) stays as quiet as before, and
    its one-line error stays the only line."""

    def __init__(self, prefix: str, quiet: float = 10.0, log: Callable[[str], None] = say,
                 clock: Callable[[], float] = time.perf_counter):
        self.prefix, self.quiet, self.log, self.clock = prefix, quiet, log, clock
        self.start = self.last = clock()

    def done(self, name: str) -> float:
        """Step `name` ended (logged if the stage has run `quiet` seconds); its seconds."""
        now = self.clock()
        took, self.last = now - self.last, now
        if now - self.start >= self.quiet:
            self.log(f"{self.prefix}: {name} {duration(took)} ({duration(now - self.start)} so far)")
        return took


def ticker(what: str, total: int, every: float = 30.0, log: Callable[[str], None] = say,
           clock: Callable[[], float] = time.monotonic) -> Callable[[int], None]:
    """An `advance(n)` that logs `what done/total (share), elapsed, about ETA left` at most every
    `every` seconds, never for the last item (the step's own line says it ended)."""
    start = last = clock()
    done = 0

    def advance(n: int) -> None:
        nonlocal done, last
        done += n
        now = clock()
        if now - last < every or done >= total:
            return
        last = now
        share = f" ({done / total:.0%})" if total else ""
        log(f"{what} {done:,}/{total:,}{share}, {duration(now - start)}, {eta(now - start, done, total)}")

    return advance
