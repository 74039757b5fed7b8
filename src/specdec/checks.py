"""One integer check for settings and arguments (imports nothing from specdec).

Python's ``bool`` is a subclass of ``int``, so ``isinstance(True, int)`` holds; a setting such as
``gamma=True`` must still be refused. :func:`is_int` says whether a value is a real integer and
:func:`check_int` raises the one message every setting uses::

    gamma=0 is invalid: must be an integer >= 1 (drafted tokens per round)
"""

from __future__ import annotations

from typing import Any


def is_int(value: Any) -> bool:
    """True for an ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(name: str, value: Any, low: int = 1, high: int | None = None, *, note: str = "",
              error: type[Exception] = ValueError) -> int:
    """``value`` if it is an integer in ``[low, high]`` (``high=None``: no upper end), else ``error``.

    The message names the value and the accepted range, then ``note``:
    ``f"{name}={value!r} is invalid: must be an integer >= {low}{note}"`` (or ``in [{low}, {high}]``).
    """
    if not is_int(value) or value < low or (high is not None and value > high):
        accepted = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise error(f"{name}={value!r} is invalid: must be an integer {accepted}{note}")
    return value
