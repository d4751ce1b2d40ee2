"""Mini-batch training and evaluation of one model (docs/architecture.md §3-4).

Training is inductive: the model only sees the subgraph induced by the training nodes
(``store.induced(store.train_idx)``), sampled with a seeded ``torch.Generator``; validation and
test run on the full graph through the server's execution path
(:class:`gnnaas.inference.InferencePath` with the serving sampler,
:func:`gnnaas.runtime.sampled_path`), so an evaluation is deterministic, does not depend on
the batch size, and scores what the server would answer. Every
variant of a dataset trains with the same :class:`TrainConfig`; a variant's kept features
(``keep``) only change the input width.

Single-label datasets use cross-entropy and accuracy; multi-label ones use BCE-with-logits and
F1-micro with logits thresholded at 0. Training stops early once the validation metric has not
improved for ``patience`` evaluations, and the best-validation weights are restored. Each epoch is
reported as it finishes (an :class:`EpochReport` to ``on_epoch``, the bar's postfix, an INFO log
line): a long run is never silent.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from gnnaas.errors import ConfigError
from gnnaas.models import FAMILIES, GNN, Arch, build_model
from gnnaas.typing import Device
from gnnaas.utils import resolve_device

if TYPE_CHECKING:
    from gnnaas.data import GraphStore
    from gnnaas.inference import InferencePath
    from gnnaas.sampling import Block, NeighborSampler

__all__ = [
    "DISTILL_TEMPERATURE",
    "DISTILL_WEIGHT",
    "EpochReport",
    "TrainConfig",
    "TrainResult",
    "evaluate",
    "evaluate_path",
    "train_model",
]

_log = logging.getLogger(__name__)

DISTILL_WEIGHT = 0.7
"""Share of the teacher's term in a distilled model's loss (the labels' loss has the rest)."""
DISTILL_TEMPERATURE = 2.0
"""Softmax temperature of the teacher's and the student's predictions in distillation."""


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters shared by every variant of a dataset.

    Args:
        hidden_channels (int, optional): width of the hidden layer(s). (default: ``256``)
        num_layers (int, optional): number of GNN layers (= hops). (default: ``2``)
        dropout (float, optional): dropout between layers. (default: ``0.5``)
        lr (float, optional): Adam learning rate. (default: ``0.005``)
        weight_decay (float, optional): Adam weight decay (L2). (default: ``5e-4``)
        batch_size (int, optional): seed nodes per mini-batch, also for evaluation.
            (default: ``1024``)
        fanouts (tuple[int, ...], optional): neighbors sampled per hop in PyG order (the seeds'
            neighbors first); ``-1`` takes all. One per layer. (default: ``(25, 10)``)
        max_epochs (int, optional): upper bound on training epochs. (default: ``200``)
        patience (int, optional): stop after this many evaluations without a better validation
            metric. (default: ``20``)
        eval_every (int, optional): evaluate on the validation set every this many epochs.
            (default: ``1``)
        seed (int, optional): seed of the initialization, shuffling, sampling and dropout.
            (default: ``0``)
        family (str, optional): the models' layer layout, ``gnnaas`` or ``pyg`` (that of a
            user's PyG master model; see :func:`gnnaas.models.build_model`).
            (default: ``"gnnaas"``)

    Example:
        >>> TrainConfig(seed=1, max_epochs=50).fanouts
        (25, 10)
    """

    hidden_channels: int = 256
    num_layers: int = 2
    dropout: float = 0.5
    lr: float = 0.005
    weight_decay: float = 5e-4
    batch_size: int = 1024
    fanouts: tuple[int, ...] = (25, 10)
    max_epochs: int = 200
    patience: int = 20
    eval_every: int = 1
    seed: int = 0
    family: str = "gnnaas"

    def __post_init__(self) -> None:
        object.__setattr__(self, "fanouts", tuple(int(f) for f in self.fanouts))
        for name in ("hidden_channels", "num_layers", "batch_size", "max_epochs", "patience"):
            _check_positive_int("TrainConfig", name, getattr(self, name))
        _check_positive_int("TrainConfig", "eval_every", self.eval_every)
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"TrainConfig expects dropout in [0, 1) (got {self.dropout!r})")
        if not self.lr > 0.0:
            raise ConfigError(f"TrainConfig expects lr > 0 (got {self.lr!r})")
        if not self.weight_decay >= 0.0:
            raise ConfigError(f"TrainConfig expects weight_decay >= 0 (got {self.weight_decay!r})")
        if len(self.fanouts) != self.num_layers:
            raise ConfigError(
                f"TrainConfig expects one fanout per layer: num_layers={self.num_layers} "
                f"(got fanouts={self.fanouts})"
            )
        if self.family not in FAMILIES:
            raise ConfigError(f"TrainConfig expects family in {FAMILIES} (got {self.family!r})")
        if any(f == 0 or f < -1 for f in self.fanouts):
            raise ConfigError(f"TrainConfig expects fanouts >= 1 or -1 (got {self.fanouts})")


@dataclass(frozen=True)
class EpochReport:
    """One finished training epoch, as :func:`train_model` reports it to ``on_epoch``.

    Args:
        epoch (int): the epoch, from 1.
        max_epochs (int): the most epochs the run may take (``TrainConfig.max_epochs``).
        loss (float): mean training loss of the epoch.
        val_acc (float): validation metric after the epoch, in ``[0, 1]`` (NaN when the epoch
            was not evaluated, see ``TrainConfig.eval_every``).
        epoch_s (float): wall time of the epoch, its evaluation included.
        best_epoch (int): the epoch of the best validation metric so far (0: none yet).
        best_val_acc (float): that metric (NaN: none yet).
        last (bool): the run stops after this epoch (early stopping, or ``max_epochs``).
    """

    epoch: int
    max_epochs: int
    loss: float
    val_acc: float
    epoch_s: float
    best_epoch: int = 0
    best_val_acc: float = math.nan
    last: bool = False


@dataclass(eq=False)
class TrainResult:
    """The outcome of :func:`train_model`.

    Args:
        model (GNN): the model with its best-validation weights, on the CPU, in eval mode.
        val_acc (float): best validation accuracy (F1-micro for multi-label), in ``[0, 1]``.
        test_acc (float): test accuracy of ``model``, in ``[0, 1]`` (NaN without test nodes).
        epochs (int): epochs run (early stopping included).
        train_time_s (float): wall time of :func:`train_model`, final test evaluation included.
        best_epoch (int): the epoch whose weights ``model`` holds.
        history (list[dict[str, float]]): one entry per evaluation: ``epoch``, ``loss`` (mean
            training loss of the epoch) and ``val_acc``.
    """

    model: GNN
    val_acc: float
    test_acc: float
    epochs: int
    train_time_s: float
    best_epoch: int = 0
    history: list[dict[str, float]] = field(default_factory=list)


def train_model(
    store: GraphStore,
    arch: str | Arch,
    config: TrainConfig | None = None,
    *,
    keep: Tensor | None = None,
    device: Device = "cpu",
    progress: bool = False,
    init_state: Mapping[str, Tensor] | None = None,
    teacher: GNN | None = None,
    on_epoch: Callable[[EpochReport], None] | None = None,
) -> TrainResult:
    """Trains one model of architecture ``arch`` on ``store``, inductively, with early stopping.

    With a ``teacher`` the model is *distilled*: its loss mixes the labels' loss with the
    divergence from the teacher's predictions on the same sampled blocks
    (:data:`DISTILL_WEIGHT`, :data:`DISTILL_TEMPERATURE`). A narrower student that learns the
    teacher's answers disagrees with it on fewer nodes than one trained on the labels alone, so
    its paired accuracy interval against the teacher is tighter (what small tolerances admit).

    Args:
        store (GraphStore): the dataset; it stays on the CPU, mini-batches move to ``device``.
        arch (str | Arch): ``sage`` or ``gin``.
        config (TrainConfig, optional): hyper-parameters. (default: ``TrainConfig()``)
        keep (Tensor, optional): ``[F_kept]`` int64 ids of the input features the model reads
            (a pruned variant); ``None`` keeps all. (default: ``None``)
        device (str | torch.device, optional): where the model trains (``auto``, ``cpu``,
            ``cuda``). (default: ``"cpu"``)
        progress (bool, optional): show a progress bar over epochs, each epoch's loss,
            validation metric and seconds in its postfix. (default: ``False``)
        init_state (Mapping[str, Tensor], optional): initial weights instead of a random
            initialization (a warm start, e.g. :func:`gnnaas.variants.master.warm_start_state`).
            (default: ``None``)
        teacher (GNN, optional): a trained model reading the same kept features (``keep``) whose
            predictions the model learns too (distillation); it is run in eval mode and not
            changed. (default: ``None``)
        on_epoch (Callable[[EpochReport], None], optional): called as each epoch finishes
            (progress of a longer plan, e.g. :func:`gnnaas.variants.pipeline.generate_variants`).
            (default: ``None``)

    Returns:
        TrainResult: the best-validation model (on the CPU, eval mode) and its metrics.

    Raises:
        ConfigError: unknown ``arch`` or bad ``keep``.

    Example:
        >>> result = train_model(load_dataset("synth-small"), "sage", TrainConfig(max_epochs=20))
        >>> result.model.in_channels == result.model.first_layer_weights()[0].shape[1]
        True
    """
    start = time.perf_counter()
    config = TrainConfig() if config is None else config
    arch = Arch.parse(arch)
    device = resolve_device(device)
    keep = _check_keep(keep, store.num_features)
    data = _training_data(store, keep, config)
    x_full = store.x if keep is None else store.feature_subset(keep)  # [N, F_kept]

    torch.manual_seed(config.seed)  # init and dropout
    generator = torch.Generator().manual_seed(config.seed)  # shuffling and sampling
    model = _initial_model(arch, data.x.size(1), store.num_classes, config, init_state, device)
    if teacher is not None:
        teacher = _check_teacher(teacher, data.x.size(1), store.num_classes).to(device).eval()
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    # Validation and test run the served pipeline: serving sampler (its default seed), full graph.
    eval_path = _eval_path(model, store, x_full, config.fanouts, 0, device)
    _log.info(
        "dataset: %s  arch: %s  in_channels: %d  train_nodes: %d  device: %s",
        store.name,
        arch.value,
        data.x.size(1),
        data.seeds.numel(),
        device,
    )
    run = _Run(model, optimizer, data, config, generator, device, teacher)
    fit = _fit(
        run, eval_path, store, desc=f"train {arch.value}", progress=progress, on_epoch=on_epoch
    )
    return _result(model, fit, eval_path, store, config, start)


def _initial_model(
    arch: Arch,
    in_channels: int,
    num_classes: int,
    config: TrainConfig,
    init_state: Mapping[str, Tensor] | None,
    device: torch.device,
) -> GNN:
    """The model before training, on ``device``: built from ``config`` (seeded by the caller),
    or warm-started from ``init_state`` (shapes checked by torch)."""
    model = build_model(
        arch,
        in_channels,
        config.hidden_channels,
        num_classes,
        num_layers=config.num_layers,
        dropout=config.dropout,
        family=config.family,
    )
    if init_state is not None:
        model.load_state_dict(init_state, strict=True)
    return model.to(device)


def _result(
    model: GNN,
    fit: _Fit,
    eval_path: InferencePath,
    store: GraphStore,
    config: TrainConfig,
    start: float,
) -> TrainResult:
    """The trained model's result: its best-validation weights, their test accuracy on the
    served pipeline, the model back on the CPU in eval mode."""
    model.load_state_dict(fit.best_state)
    test_acc = evaluate_path(eval_path, store.y, store.test_idx, config.batch_size)
    model = model.cpu().eval()
    train_time_s = time.perf_counter() - start
    _log.info(
        "epochs: %d  best_epoch: %d  val_acc: %.4f  test_acc: %.4f  train_time_s: %.2f",
        fit.epochs,
        fit.best_epoch,
        fit.best_acc,
        test_acc,
        train_time_s,
    )
    return TrainResult(
        model=model,
        val_acc=fit.best_acc,
        test_acc=test_acc,
        epochs=fit.epochs,
        train_time_s=train_time_s,
        best_epoch=fit.best_epoch,
        history=fit.history,
    )


def evaluate(
    model: GNN,
    store: GraphStore,
    nodes: Tensor,
    *,
    keep: Tensor | None = None,
    fanouts: Sequence[int] = (25, 10),
    batch_size: int = 1024,
    device: Device = "cpu",
    seed: int = 0,
) -> float:
    """Accuracy (F1-micro for multi-label) of ``model`` on ``nodes`` of the full graph.

    Batches run through the server's execution path (:class:`gnnaas.inference.InferencePath`)
    with the serving sampler (:func:`gnnaas.runtime.sampled_path`): each node's sampled
    computation tree depends on its id, the depth and ``seed`` only, never on its batch-mates, so
    the result is deterministic and does not depend on ``batch_size`` (up to float summation
    order).

    Args:
        model (GNN): a model whose input width is ``len(keep)`` (or ``store.num_features``);
            it is moved to ``device`` and keeps its train/eval mode.
        store (GraphStore): the dataset (stays on the CPU).
        nodes (Tensor): ``[n]`` int64 ids of the nodes to score (e.g. ``store.test_idx``).
        keep (Tensor, optional): ``[F_kept]`` int64 kept feature ids. (default: ``None``)
        fanouts (Sequence[int], optional): neighbors per hop, PyG order. (default: ``(25, 10)``)
        batch_size (int, optional): seeds per batch. (default: ``1024``)
        device (str | torch.device, optional): where the model runs. (default: ``"cpu"``)
        seed (int, optional): seed of the serving sampler (the server's ``GNNAAS_SEED``).
            (default: ``0``)

    Returns:
        float: the metric in ``[0, 1]``.
    """

    _check_positive_int("evaluate", "batch_size", batch_size)
    nodes = torch.as_tensor(nodes, dtype=torch.int64)
    if nodes.dim() != 1 or nodes.numel() == 0:
        raise ValueError(
            f"evaluate expects a non-empty 1-D nodes tensor (got {tuple(nodes.shape)})"
        )
    keep = _check_keep(keep, store.num_features)
    device = resolve_device(device)
    x = store.x if keep is None else store.feature_subset(keep)
    if model.in_channels != x.size(1):
        raise ValueError(
            f"evaluate: the model reads {model.in_channels} features but keep selects {x.size(1)}; "
            "pass the variant's kept feature ids as keep"
        )
    was_training = model.training
    model.to(device)
    try:
        path = _eval_path(model, store, x, fanouts, seed, device)
        return evaluate_path(path, store.y, nodes, batch_size)
    finally:
        model.train(was_training)


# ----------------------------------------------------------------------------------------------
# helpers


@dataclass(frozen=True)
class _TrainingData:
    """What the model trains on: the subgraph induced by the training nodes (inductive), with
    node ids ``0..N_train-1``."""

    sampler: NeighborSampler
    x: Tensor  # [N_train, F_kept]
    y: Tensor  # [N_train] or [N_train, C]
    seeds: Tensor  # the training nodes, every node of the subgraph with a training label


def _training_data(store: GraphStore, keep: Tensor | None, config: TrainConfig) -> _TrainingData:
    """The training subgraph of ``store``, checked to hold what training and early stopping
    need (two training nodes, validation nodes)."""
    from gnnaas.runtime import training_sampler

    train = store.induced(store.train_idx)  # inductive: train-only subgraph, ids 0..n_train-1
    x = train.x if keep is None else train.feature_subset(keep)  # [N_train, F_kept]
    seeds = train.train_idx
    if seeds.numel() < 2:
        raise ValueError(f"train_model needs at least 2 training nodes (got {seeds.numel()})")
    if store.val_idx.numel() == 0:
        raise ValueError(
            f"train_model needs validation nodes for early stopping; store '{store.name}' has none"
        )
    sampler = training_sampler(train.rowptr, train.col, config.fanouts, seed=config.seed)
    return _TrainingData(sampler, x, train.y, seeds)


def _check_teacher(teacher: GNN, in_channels: int, num_classes: int) -> GNN:
    """``teacher``, when it reads the student's features and predicts its classes."""
    if teacher.in_channels != in_channels or teacher.out_channels != num_classes:
        raise ConfigError(
            f"train_model: the teacher reads {teacher.in_channels} features and predicts "
            f"{teacher.out_channels} classes; the student reads {in_channels} and "
            f"predicts {num_classes} (distill a variant from one with its kept features)"
        )
    return teacher


@dataclass(frozen=True)
class _Run:
    """One training run's moving parts, as each epoch uses them."""

    model: GNN
    optimizer: torch.optim.Optimizer
    data: _TrainingData
    config: TrainConfig
    generator: torch.Generator  # shuffling and sampling
    device: torch.device
    teacher: GNN | None  # distillation's, in eval mode


@dataclass
class _Fit:
    """The early-stopping record of a run: the best validation metric so far and its weights."""

    best_state: dict[str, Tensor]
    best_acc: float = -1.0
    best_epoch: int = 0
    stale: int = 0  # evaluations since the best
    epochs: int = 0
    history: list[dict[str, float]] = field(default_factory=list)

    def record(self, epoch: int, loss: float, val_acc: float, model: GNN, patience: int) -> bool:
        """Records an evaluation; returns whether training goes on."""
        self.history.append({"epoch": float(epoch), "loss": loss, "val_acc": val_acc})
        if val_acc > self.best_acc:
            self.best_acc, self.best_epoch, self.stale = val_acc, epoch, 0
            self.best_state = _copy_state(model)
            return True
        self.stale += 1
        return self.stale < patience


def _fit(
    run: _Run,
    eval_path: InferencePath,
    store: GraphStore,
    *,
    desc: str,
    progress: bool,
    on_epoch: Callable[[EpochReport], None] | None = None,
) -> _Fit:
    """Trains epoch after epoch, evaluating every ``eval_every`` epochs (and after the last),
    until ``max_epochs`` or ``patience`` evaluations without a better validation metric; each
    epoch is reported as it finishes."""
    from tqdm import tqdm

    config = run.config
    fit = _Fit(best_state=_copy_state(run.model))
    bar = tqdm(total=config.max_epochs, desc=desc, disable=not progress)
    try:
        for epoch in range(1, config.max_epochs + 1):
            started = time.perf_counter()
            fit.epochs = epoch
            loss = _train_epoch(run)
            val_acc, going = math.nan, epoch < config.max_epochs
            if epoch % config.eval_every == 0 or not going:
                val_acc = evaluate_path(eval_path, store.y, store.val_idx, config.batch_size)
                going = fit.record(epoch, loss, val_acc, run.model, config.patience) and going
            report = EpochReport(
                epoch=epoch,
                max_epochs=config.max_epochs,
                loss=loss,
                val_acc=val_acc,
                epoch_s=time.perf_counter() - started,
                best_epoch=fit.best_epoch,
                best_val_acc=fit.best_acc if fit.best_epoch else math.nan,
                last=not going,
            )
            _report_epoch(report, bar, on_epoch)
            if not going:
                break
    finally:
        bar.close()
    return fit


def _report_epoch(
    report: EpochReport, bar: Any, on_epoch: Callable[[EpochReport], None] | None
) -> None:
    """The epoch in the log (evaluated epochs), the run's own bar and ``on_epoch``."""
    if math.isfinite(report.val_acc):
        _log.info(
            "epoch: %03d  loss: %.4f  val_acc: %.4f  epoch_s: %.3f",
            report.epoch,
            report.loss,
            report.val_acc,
            report.epoch_s,
        )
    bar.update(1)
    bar.set_postfix(
        loss=f"{report.loss:.4f}", val_acc=f"{report.val_acc:.4f}", epoch_s=f"{report.epoch_s:.2f}"
    )
    if on_epoch is not None:
        on_epoch(report)


def _train_epoch(run: _Run) -> float:
    """One pass over shuffled training seeds; returns the mean training loss."""
    model, data, device = run.model, run.data, run.device
    model.train()
    perm = data.seeds[torch.randperm(data.seeds.numel(), generator=run.generator)]
    batches = list(torch.split(perm, run.config.batch_size))
    if len(batches) > 1 and batches[-1].numel() < 2:
        # batch norm cannot train on a single seed: fold it into the previous batch
        batches[-2:] = [torch.cat(batches[-2:])]
    total = torch.zeros((), device=device)
    for batch in batches:
        sub = data.sampler.sample(batch, generator=run.generator)
        xb = _to_device(data.x[sub.n_id], device)  # [N_s, F_kept]
        yb = _to_device(data.y[sub.n_id[: sub.batch_size]], device)  # [B] or [B, C]
        blocks = _blocks_to(sub.blocks, device)
        out = model(xb, blocks)  # [B, C]
        loss = _loss(out, yb)
        if run.teacher is not None:
            with torch.no_grad():
                target = run.teacher(xb, blocks)  # [B, C], eval mode: no dropout
            loss = (1.0 - DISTILL_WEIGHT) * loss + DISTILL_WEIGHT * _distill_loss(out, target, yb)
        run.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        run.optimizer.step()
        total += loss.detach() * batch.numel()
    return float(total) / data.seeds.numel()  # one sync per epoch


def _eval_path(
    model: GNN,
    store: GraphStore,
    x: Tensor,
    fanouts: Sequence[int],
    seed: int,
    device: torch.device,
) -> InferencePath:
    """The server's execution path over the full graph for ``model`` (which it puts in eval)."""
    from gnnaas.runtime import sampled_path

    return sampled_path(model, x, store.rowptr, store.col, fanouts, seed=seed, device=device)


def evaluate_path(path: InferencePath, y: Tensor, nodes: Tensor, batch_size: int) -> float:
    """The metric of ``nodes`` (accuracy, or F1-micro for multi-label) through ``path``."""
    from gnnaas.inference import metric, score_parts

    if nodes.numel() == 0:
        return float("nan")
    path.model.eval()
    nums, dens = [], []
    for batch in torch.split(nodes, batch_size):
        logits = path.run(batch).logits  # [B, C] on the host
        num, den = score_parts(logits, y[batch])
        nums.append(num)
        dens.append(den)
    return metric(torch.cat(nums), torch.cat(dens))


def _distill_loss(out: Tensor, target: Tensor, y: Tensor) -> Tensor:
    """Divergence of the student's logits ``out`` from the teacher's ``target`` (both ``[B, C]``)
    at :data:`DISTILL_TEMPERATURE`, scaled by its square (Hinton et al.) so that its gradients
    keep the labels' loss's scale."""
    t = DISTILL_TEMPERATURE
    if y.dim() == 2:  # multi-label: each class is its own binary problem
        soft = torch.sigmoid(target / t)
        return F.binary_cross_entropy_with_logits(out / t, soft) * t * t
    log_p = F.log_softmax(out / t, dim=-1)
    soft = F.softmax(target / t, dim=-1)
    return F.kl_div(log_p, soft, reduction="batchmean") * t * t


def _loss(out: Tensor, y: Tensor) -> Tensor:
    if y.dim() == 2:
        return F.binary_cross_entropy_with_logits(out, y.to(out.dtype))
    return F.cross_entropy(out, y)


def _to_device(t: Tensor, device: torch.device) -> Tensor:
    if device.type == "cpu":
        return t
    if device.type == "cuda":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def _blocks_to(blocks: Sequence[Block], device: torch.device) -> list[Block]:
    if device.type == "cpu":
        return list(blocks)
    return [dataclasses.replace(b, edge_index=_to_device(b.edge_index, device)) for b in blocks]


def _copy_state(model: torch.nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _check_keep(keep: Tensor | None, num_features: int) -> Tensor | None:
    if keep is None:
        return None
    keep = torch.as_tensor(keep)
    if keep.dtype != torch.int64 or keep.dim() != 1 or keep.numel() == 0:
        raise ConfigError(
            f"keep must be a non-empty 1-D int64 tensor of feature ids "
            f"(got dtype={keep.dtype}, shape={tuple(keep.shape)})"
        )
    if int(keep.min()) < 0 or int(keep.max()) >= num_features:
        raise ConfigError(
            f"keep holds feature ids outside [0, {num_features}) "
            f"(got min {int(keep.min())}, max {int(keep.max())})"
        )
    return keep.cpu()


def _check_positive_int(component: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{component} expects {name} to be an integer >= 1 (got {value!r})")
