"""What :meth:`Model.train <fnnc.models.Model.train>` shows while it runs: one line per epoch.

In a terminal each epoch gets its own tqdm bar (``epoch 2/5``) that stays on screen
when the epoch ends, with the epoch's metrics and time on it, as Keras prints its
epochs; the history of the run reads top to bottom. Elsewhere (a log file, a notebook
cell capturing stderr) each epoch prints one plain line when it ends. The metrics
include those callbacks add (``LearningRate``'s ``lr``): ``train`` shows the line after
the callbacks with ``adds_metrics = True`` and before the others.

The rate and ETA leave compiling out: the first step of a ``train`` call compiles the
training program (seconds, where a step takes milliseconds), so the bar of the first
epoch starts its clock after that step, counting it as already done.

>>> import io
>>> from fnnc.models.progress import EpochLines
>>> out = io.StringIO()
>>> lines = EpochLines(target=2, bars=False, stream=out)
>>> lines.begin(0, 4, 0); lines.step(); lines.end({"loss": 0.5, "val_loss": 0.25}, 1.0)
>>> out.getvalue()
'epoch 1/2: loss 0.5000, val_loss 0.2500 (1.0 s)\\n'
"""

from __future__ import annotations

import sys
from typing import Any, TextIO


def format_logs(logs: dict[str, float]) -> str:
    """``loss 0.5000, val_loss 0.2500``: an epoch's metrics as one line's text."""
    return ", ".join(f"{k} {v:.4f}" for k, v in logs.items())


def _has_tqdm() -> bool:
    """tqdm comes with the ``examples`` extra; without it the plain lines are shown."""
    import importlib.util

    return importlib.util.find_spec("tqdm") is not None


class EpochLines:
    """One bar (terminal) or one line per epoch; see the module docstring.

    Args:
        target: the epoch the run ends at (shown as ``epoch e/target``).
        bars: tqdm bars (a terminal), else one plain line per epoch.
        stream: where to write (default ``sys.stderr``).
    """

    def __init__(self, target: int, *, bars: bool, stream: TextIO | None = None):
        self.target, self.bars = target, bars and _has_tqdm()
        self.stream = stream
        self._bar: Any = None
        self._epoch = 0
        self._total = 0
        self._done = 0
        self._compiled = False  # the call's first step (the compile) has run

    def _out(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stderr

    def begin(self, epoch: int, total: int, done: int) -> None:
        """Epoch ``epoch`` (from 0) starts with ``done`` of its ``total`` batches run."""
        self._epoch, self._total, self._done = epoch, total, done
        if self.bars and self._compiled:
            self._open()

    def _open(self) -> None:
        from tqdm import tqdm

        # smoothing=0: the rate is the mean since the bar opened, so an early slow step
        # (a recompile for a last, smaller batch) does not swing the ETA.
        self._bar = tqdm(
            total=self._total, initial=self._done, desc=f"epoch {self._epoch + 1}/{self.target}",
            unit="step", dynamic_ncols=True, leave=True, smoothing=0, file=self._out(),
        )  # fmt: skip

    def step(self) -> None:
        """One training step of the epoch has run (its loss is on the host)."""
        self._done += 1
        if self._bar is not None:
            self._bar.update(1)
        elif self.bars and not self._compiled:
            self._open()  # after the compiling step: it counts as done, not in the rate
        self._compiled = True

    def end(self, logs: dict[str, float], seconds: float) -> None:
        """The epoch ended with metrics ``logs`` after ``seconds`` of wall time."""
        text = format_logs(logs)
        if self.bars:
            if self._bar is None:
                self._open()
            self._bar.set_postfix_str(f"{text} ({seconds:.1f} s)", refresh=True)
            self._bar.close()
            self._bar = None
        else:
            line = f"epoch {self._epoch + 1}/{self.target}: {text} ({seconds:.1f} s)"
            print(line, file=self._out(), flush=True)

    def close(self) -> None:
        """Closes a bar left open (training stopped inside an epoch)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
