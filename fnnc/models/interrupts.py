"""Ctrl-C that waits for a training step to be stored.

``fit`` and ``apply_gradients`` donate the parameters and optimizer state to their
programs: once the compiled call has run, the old buffers are deleted and the only
copies of the weights are the call's outputs. A ``KeyboardInterrupt`` raised between
the call returning and the engine storing those outputs would leave the model holding
deleted arrays. Python raises it at the next bytecode boundary after the SIGINT
arrives, which no ``try`` can fence off (the outputs may not be bound to a name yet),
so the engine holds the signal instead: :func:`deferred_interrupt` records a SIGINT
that arrives inside its block and calls the handler it replaced once the block is
done, so Ctrl-C still stops the program, one step later and with the model whole.

>>> import signal
>>> from fnnc.models.interrupts import deferred_interrupt
>>> done = []
>>> try:
...     with deferred_interrupt():
...         signal.raise_signal(signal.SIGINT)
...         done.append("stored")
... except KeyboardInterrupt:
...     done.append("interrupted")
>>> done
['stored', 'interrupted']
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

_holding = False  # a block on the main thread holds SIGINT now: blocks inside it do nothing


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[None]:
    """Holds a SIGINT that arrives inside the block until the block has finished, then
    calls the handler it replaced (Python's default raises ``KeyboardInterrupt``).

    Only on the main thread (the only one Python delivers signals to) and only when
    the SIGINT handler is a Python function; otherwise (``SIG_IGN``, ``SIG_DFL``, a
    handler set outside Python) the block runs as it is. Blocks nest: one inside a
    holding block does nothing (no handler swapped per training step twice), and the
    outer one delivers the signal once it is done.
    """
    global _holding
    if _holding or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):
        yield
        return
    held: list[tuple[int, Any]] = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append((signum, frame)))
    _holding = True
    try:
        yield
    finally:
        _holding = False
        signal.signal(signal.SIGINT, previous)
        if held:
            previous(*held[0])
