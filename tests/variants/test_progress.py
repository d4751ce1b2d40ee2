"""A plan's training progress: epochs on the bar's postfix (terminal) or as ``key: value`` lines
(logs), and the estimate of a plan that may take long."""

from __future__ import annotations

import math
from typing import Any

import pytest

from gnnaas.variants.progress import LONG_PLAN_S, PlanProgress, estimate_range_s
from gnnaas.variants.training import EpochReport, TrainConfig

CONFIG = TrainConfig(max_epochs=200, patience=20)


class _Bar:
    """What :class:`PlanProgress` uses of a tqdm bar."""

    def __init__(self, mininterval: float = 5.0) -> None:
        self.mininterval = mininterval
        self.lines: list[str] = []
        self.postfix = ""

    def write(self, line: str, file: Any = None) -> None:
        self.lines.append(line)

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _report(epoch: int, *, last: bool = False, epoch_s: float = 0.5) -> EpochReport:
    return EpochReport(
        epoch=epoch,
        max_epochs=200,
        loss=1.0 / epoch,
        val_acc=0.5 + epoch / 1000,
        epoch_s=epoch_s,
        best_epoch=epoch,
        best_val_acc=0.5 + epoch / 1000,
        last=last,
    )


def test_log_lines_first_last_and_one_per_interval() -> None:
    bar, clock = _Bar(mininterval=5.0), _Clock()
    shown = PlanProgress(bar, models=2, config=CONFIG, terminal=False, clock=clock)
    shown.start("sage-full-1x")
    for epoch, now in ((1, 0.0), (2, 1.0), (3, 4.9), (4, 5.0), (5, 6.0)):
        clock.now = now
        shown.epoch(_report(epoch, last=epoch == 5))
    assert bar.lines == [
        "variant: sage-full-1x  epoch: 001/200  loss: 1.0000  val_acc: 0.5010  epoch_s: 0.500",
        "variant: sage-full-1x  epoch: 004/200  loss: 0.2500  val_acc: 0.5040  epoch_s: 0.500",
        "variant: sage-full-1x  epoch: 005/200  loss: 0.2000  val_acc: 0.5050  epoch_s: 0.500  "
        "best_epoch: 005  best_val_acc: 0.5050",
    ]
    assert bar.postfix == "" and shown.remaining == 1  # one model done
    shown.start("sage-greedy-2x")
    clock.now = 6.5
    shown.epoch(_report(1))  # a model's first epoch is always written
    assert bar.lines[-1].startswith("variant: sage-greedy-2x  epoch: 001/200")


def test_terminal_postfix_and_no_lines() -> None:
    bar = _Bar()
    shown = PlanProgress(bar, models=1, config=CONFIG, terminal=True)
    shown.start("gin-lasso-4x")
    shown.epoch(_report(12, epoch_s=1.234))
    assert bar.postfix == "gin-lasso-4x epoch 12/200 loss 0.0833 val_acc 0.5120 1.23 s/epoch"
    assert bar.lines == []  # 1 model x 200 epochs x 1.2 s: within LONG_PLAN_S


@pytest.mark.parametrize("terminal", [True, False])
def test_a_long_plan_says_so_once_after_its_first_epoch(terminal: bool) -> None:
    bar = _Bar()
    shown = PlanProgress(bar, models=18, config=CONFIG, terminal=terminal)
    shown.start("sage-full-1x")
    shown.epoch(_report(1, epoch_s=3.2))
    estimate = (
        "estimate: 18 model(s) to train at 3.20 s per epoch (the pace of the first): "
        "20 min if each stops at its earliest (21 epochs), 3 h 12 min if each runs all 200"
    )
    assert estimate in bar.lines
    shown.epoch(_report(2, epoch_s=3.2))
    assert bar.lines.count(estimate) == 1


def test_estimate_range() -> None:
    assert estimate_range_s(2.0, 3, TrainConfig(max_epochs=100, patience=9)) == (60.0, 600.0)
    # evaluated every 5 epochs: the earliest stop is 5 x (patience + 1), capped by max_epochs
    config = TrainConfig(max_epochs=40, patience=9, eval_every=5)
    assert estimate_range_s(1.0, 1, config) == (40.0, 40.0)
    # the threshold: a plan of 1 model whose 200 epochs fit in LONG_PLAN_S says nothing
    bar = _Bar()
    shown = PlanProgress(bar, models=1, config=CONFIG, terminal=True)
    shown.epoch(_report(1, epoch_s=LONG_PLAN_S / 200))
    assert bar.lines == []
    assert math.isclose(estimate_range_s(LONG_PLAN_S / 200, 1, CONFIG)[1], LONG_PLAN_S)
