"""What every measurement of the `evaluate` stage shares: the progress callback and a safe ratio."""

from __future__ import annotations

from collections.abc import Callable

# progress("what", total) -> advance(n); None = silent
Progress = Callable[[str, int], Callable[[int], None]]


def silent(description: str, total: int) -> Callable[[int], None]:
    """The progress callback that shows nothing."""
    return lambda n: None


def ratio(num: float, den: float) -> float | None:
    """num / den, or None when there is nothing to divide by.

    >>> ratio(3, 4), ratio(1, 0)
    (0.75, None)
    """
    return None if den == 0 else num / den
