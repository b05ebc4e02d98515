"""Ctrl-C at a launch entry point: one line on stderr and exit status 130, never a traceback.

What an interrupted command keeps is its own business (training checkpoints its last finished
step: grpo/train/trainer.py); the exception's message, when it has one, says so.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

INTERRUPTED_STATUS = 130
"""128 + SIGINT: what a shell reports for a command that Ctrl-C stopped."""


def stops_cleanly_on_interrupt(main: Callable[..., int]) -> Callable[..., int]:
    """Wrap an entry point's `main(argv=None) -> int` so that Ctrl-C ends it with
    `interrupted (Ctrl-C)[ <what the exception says>]` and status 130."""

    @functools.wraps(main)
    def wrapper(argv=None) -> int:
        try:
            return main(argv)
        except KeyboardInterrupt as exc:
            detail = str(exc)
            print(f"interrupted (Ctrl-C){' ' + detail if detail else ''}", file=sys.stderr, flush=True)
            return INTERRUPTED_STATUS

    wrapper.stops_cleanly_on_interrupt = True  # what tests/test_interrupt.py checks for each entry point
    return wrapper
