"""What a plan of trained variants says while it trains: each epoch as it finishes, and how long
the whole plan may take.

:func:`gnnaas.variants.pipeline.generate_variants` (``gnnaas generate``, ``gnnaas prepare``) trains
one model after another, each for up to ``max_epochs`` epochs with early stopping; on a large graph
one model takes many minutes. With ``progress`` on, :class:`PlanProgress` receives every finished
epoch (:class:`~gnnaas.variants.training.EpochReport`) and shows it:

- on a terminal, as the postfix of the plan's progress bar, redrawn in place
  (``sage-lasso-2x epoch 12/200 loss 0.4321 val_acc 0.8123 1.23 s/epoch``);
- elsewhere (a log file, CI), as ``key: value`` lines with fixed number formats (``variant:
  sage-lasso-2x  epoch: 012/200  loss: 0.4321  val_acc: 0.8123  epoch_s: 1.234``): each model's
  first and last epochs (the last with its best epoch), and the others at most once per refresh
  interval of the bar (``TQDM_MININTERVAL``; the CLI sets a few seconds), so a log stays short.

**The estimate.** After the plan's first epoch, the pace of that epoch (its seconds, evaluation
included) times the epochs the models still to train may run gives a range: each model stops at
the earliest after ``eval_every * (patience + 1)`` epochs (its first evaluation is its best, then
``patience`` evaluations without a better one) and at the latest after ``max_epochs``. A plan whose
upper end is over :data:`LONG_PLAN_S` says so in one line, both ends written out. The first model
of a plan is its widest (all the features), so the pace is, if anything, slow: the range leans
long. Derived variants that train nothing (other fanouts, int8 twins) cost evaluations only and
are not in it.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gnnaas.variants.training import EpochReport, TrainConfig

__all__ = ["LONG_PLAN_S", "PlanProgress", "estimate_range_s"]

_log = logging.getLogger(__name__)

LONG_PLAN_S = 600.0
"""A plan that may train longer than this (every model to train running all its epochs at the
pace of the plan's first epoch) says so after that epoch, with its estimate: ten minutes is past
what a user waits for without wondering whether anything happens."""


def estimate_range_s(epoch_s: float, models: int, config: TrainConfig) -> tuple[float, float]:
    """Seconds ``models`` models may train at ``epoch_s`` per epoch: ``(earliest, latest)``.

    Each stops at the earliest after ``eval_every * (patience + 1)`` epochs and at the latest
    after ``max_epochs``.

    Args:
        epoch_s (float): seconds per epoch, evaluation included.
        models (int): models still to train.
        config (TrainConfig): their epochs, patience and evaluation period.

    Returns:
        tuple[float, float]: the shortest and the longest total, in seconds.

    Example:
        >>> estimate_range_s(2.0, 3, TrainConfig(max_epochs=100, patience=9))
        (60.0, 600.0)
    """
    earliest = min(config.max_epochs, config.eval_every * (config.patience + 1))
    return models * earliest * epoch_s, models * config.max_epochs * epoch_s


def _duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3 h 05 min``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"


class PlanProgress:
    """Shows a plan's training epochs on its progress bar, and its estimate once.

    Args:
        bar (tqdm): the plan's progress bar (over variants); :meth:`use` swaps it for the next
            phase's.
        models (int): the models the plan is expected to train.
        config (TrainConfig): their training configuration (epochs, patience).
        terminal (bool, optional): whether the bar is on a terminal (postfix) or in a log
            (lines). (default: ``None``: whether stderr is a terminal)
        clock (Callable[[], float], optional): seconds, for the interval between log lines.
            (default: ``time.monotonic``)
    """

    def __init__(
        self,
        bar: Any,
        *,
        models: int,
        config: TrainConfig,
        terminal: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bar = bar
        self.remaining = models
        self.config = config
        self.terminal = _stderr_is_terminal() if terminal is None else terminal
        self.clock = clock
        self.variant = ""
        self.estimated = False
        self._last_line = -math.inf

    def __repr__(self) -> str:
        return f"{type(self).__name__}(remaining={self.remaining}, variant={self.variant!r})"

    def use(self, bar: Any) -> None:
        """Shows the next epochs on ``bar`` (the next phase's)."""
        self.bar = bar

    def start(self, variant_id: str) -> None:
        """The next epochs are ``variant_id``'s."""
        self.variant = variant_id

    def epoch(self, report: EpochReport) -> None:
        """Shows a finished epoch (``on_epoch`` of :func:`~gnnaas.variants.training.train_model`)
        and, after the plan's first, its estimate when it may take long."""
        if self.terminal:
            self.bar.set_postfix_str(
                f"{self.variant} epoch {report.epoch}/{report.max_epochs} loss {report.loss:.4f} "
                f"val_acc {report.val_acc:.4f} {report.epoch_s:.2f} s/epoch"
            )
        else:
            now = self.clock()
            if report.epoch == 1 or report.last or now - self._last_line >= self.bar.mininterval:
                self._last_line = now
                self._write(_epoch_line(self.variant, report))
        if not self.estimated:
            self.estimated = True
            self._estimate(report.epoch_s)
        if report.last:
            self.remaining = max(self.remaining - 1, 0)

    def _estimate(self, epoch_s: float) -> None:
        models = max(self.remaining, 1)
        earliest_s, latest_s = estimate_range_s(epoch_s, models, self.config)
        earliest = min(self.config.max_epochs, self.config.eval_every * (self.config.patience + 1))
        text = (
            f"estimate: {models} model(s) to train at {epoch_s:.2f} s per epoch (the pace of "
            f"the first): {_duration(earliest_s)} if each stops at its earliest ({earliest} "
            f"epochs), {_duration(latest_s)} if each runs all {self.config.max_epochs}"
        )
        _log.info("%s", text)
        if latest_s > LONG_PLAN_S:
            self._write(text)

    def _write(self, line: str) -> None:
        self.bar.write(line, file=sys.stderr)


def _epoch_line(variant: str, report: EpochReport) -> str:
    line = (
        f"variant: {variant}  epoch: {report.epoch:03d}/{report.max_epochs:03d}  "
        f"loss: {report.loss:.4f}  val_acc: {report.val_acc:.4f}  epoch_s: {report.epoch_s:.3f}"
    )
    if report.last:
        line += f"  best_epoch: {report.best_epoch:03d}  best_val_acc: {report.best_val_acc:.4f}"
    return line


def _stderr_is_terminal() -> bool:
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty is not None and isatty())
