"""Fakes for the serving tests: a toy store, an identity sampler and gated linear models."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from gnnaas.policy import ServiceCurve
from gnnaas.profiling.profiles import VariantProfile
from gnnaas.serving import ServingVariant, VariantRegistry

NUM_NODES, NUM_FEATURES, NUM_CLASSES = 100, 8, 3


class FakeStore:
    """A ring graph with random features; enough of ``GraphStore`` for serving."""

    def __init__(self, name: str = "toy", num_nodes: int = NUM_NODES) -> None:
        g = torch.Generator().manual_seed(0)
        self.name = name
        self.x = torch.randn(num_nodes, NUM_FEATURES, generator=g)
        self.rowptr = torch.arange(num_nodes + 1)
        self.col = (torch.arange(num_nodes) + 1) % num_nodes
        self.num_classes = NUM_CLASSES
        self.multi_label = False

    @property
    def num_nodes(self) -> int:
        return self.x.size(0)

    @property
    def num_features(self) -> int:
        return self.x.size(1)

    def feature_subset(self, keep: Tensor) -> Tensor:
        return self.x[:, keep].contiguous()


class IdentitySampler:
    """Samples no neighbors: the model sees the seeds' own features only."""

    def sample(self, seeds: Tensor, generator: Any = None) -> SimpleNamespace:
        return SimpleNamespace(n_id=seeds, batch_size=seeds.numel(), blocks=[])


class FakeModel(torch.nn.Module):
    """A linear layer that counts calls and can be held (``gate``) or made to fail.

    Like a one-layer GNN, its embedding (``embed=True``) is its input: ``in_channels`` wide.
    """

    num_layers = 1

    def __init__(self, in_channels: int, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.in_channels = in_channels
        self.lin = torch.nn.Linear(in_channels, NUM_CLASSES)
        self.calls = 0
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.fail: str | None = None

    def forward(
        self, x: Tensor, blocks: list[Any], *, embed: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        self.calls += 1
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        if self.fail is not None:
            raise RuntimeError(self.fail)
        out = self.lin(x)
        return (x, out) if embed else out


# variant id -> (kept features, validation accuracy %, service curve points); None: no profile
TOY_VARIANTS: dict[str, tuple[int, float | None, dict[int, float] | None]] = {
    "sage-full-1x": (8, 90.0, {1: 3.0, 32: 6.0, 256: 20.0, 1024: 60.0}),
    "sage-lasso-2x": (4, 89.0, {1: 2.0, 32: 4.0, 256: 12.0, 1024: 36.0}),
    "sage-lasso-8x": (1, 85.0, {1: 1.0, 32: 2.0, 256: 6.0, 1024: 18.0}),
    "gin-random-8x": (1, None, None),
}


# The contract tests' second dataset: a smaller ring with the same variants.
RING_NODES = 60


def make_toy_registry(
    variants: dict[str, tuple[int, float | None, dict[int, float] | None]] = TOY_VARIANTS,
    datasets: tuple[str, ...] = ("toy",),
) -> tuple[VariantRegistry, dict[str, FakeModel]]:
    """A registry over :class:`FakeStore` and :class:`FakeModel` variants, and the models.

    ``datasets`` are ``toy`` (100 nodes) and/or ``ring`` (:data:`RING_NODES`), each with every
    variant; the models returned are the first dataset's.
    """
    stores = []
    models: dict[str, FakeModel] = {}
    served = []
    for name in datasets:
        if name not in ("toy", "ring"):
            raise ValueError(f"make_toy_registry: datasets are 'toy' and 'ring' (got {name!r})")
        store = FakeStore(name, NUM_NODES if name == "toy" else RING_NODES)
        stores.append(store)
        for i, (variant_id, (kept, accuracy, curve)) in enumerate(variants.items()):
            arch, ranking, prune = variant_id.split("-")
            model = FakeModel(kept, seed=i)
            if name == datasets[0]:
                models[variant_id] = model
            profile = None
            if accuracy is not None and curve is not None:
                profile = VariantProfile(accuracy, ServiceCurve.from_points(curve), accuracy - 1)
            served.append(
                ServingVariant(
                    dataset=name,
                    variant_id=variant_id,
                    arch=arch,
                    ranking=ranking,
                    prune=int(prune[:-1]),
                    kept_features=torch.arange(kept),
                    fanouts=(2, 2),
                    model=model,
                    profile=profile,
                )
            )
    registry = VariantRegistry.from_objects(
        stores, served, sampler_factory=lambda store, fanouts: IdentitySampler()
    )
    return registry, models


@contextmanager
def held(model: FakeModel) -> Iterator[threading.Event]:
    """Holds ``model``'s forward passes until the block exits (or the event is set)."""
    gate = threading.Event()
    model.entered.clear()
    model.gate = gate
    try:
        yield gate
    finally:
        gate.set()
        model.gate = None


async def next_turn() -> None:
    """Returns once every task already scheduled on the running event loop has taken its next
    step; no time passes.

    A task started with ``asyncio.ensure_future`` takes its first step on the loop's next turn
    (Python 3.11 has no eager tasks), and the router queues a request in that first step (it never
    awaits before queuing). The loop runs its ready callbacks in the order they were scheduled,
    and the one resolving this future is scheduled after theirs. Await an event instead wherever
    the code under test sets one.
    """
    loop = asyncio.get_running_loop()
    turn: asyncio.Future[None] = loop.create_future()
    loop.call_soon(turn.set_result, None)
    await turn


def wait_until(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Polls ``cond`` (set by another thread) until it holds."""
    done = threading.Event()
    deadline = timeout_s
    step = 0.002
    while not cond():
        if deadline <= 0:
            raise AssertionError("condition not reached in time")
        done.wait(step)
        deadline -= step


# -- a tiny on-disk repository (real manifests, weights and profile tables) ----------------------

# variant id -> (prune, validation accuracy %, e2e ms at batch sizes 1, 32, 256, 1024)
TINY_VARIANTS: dict[str, tuple[int, float, tuple[float, float, float, float]]] = {
    "sage-full-1x": (1, 80.0, (4.0, 8.0, 30.0, 100.0)),
    "sage-random-4x": (4, 70.0, (2.0, 4.0, 12.0, 40.0)),
}


def tiny_store(name: str = "tiny", num_nodes: int = 300) -> Any:
    """A random graph as a real ``GraphStore``."""
    from gnnaas.data.store import GraphStore

    g = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, num_nodes, (2, 8 * num_nodes), generator=g)
    x = torch.randn(num_nodes, 16, generator=g)
    y = torch.randint(0, NUM_CLASSES, (num_nodes,), generator=g)
    return GraphStore.from_edge_index(name, edge_index, x, y, NUM_CLASSES)


def write_tiny_repository(
    root: Any,
    store: Any,
    variants: dict[str, tuple[int, float, tuple[float, float, float, float]]] = TINY_VARIANTS,
    *,
    profiled: tuple[str, ...] | None = None,
    settings: dict[str, Any] | None = None,
) -> tuple[Any, Any]:
    """Saves untrained variants of ``store`` and their profiles under ``root``.

    Returns the variants folder and the profiles folder. ``profiled`` limits which variants get
    profile rows (default: all). The curves are stamped with ``settings`` (default: those of a
    server with the default settings on the CPU, so it routes on them as they are).
    """
    from gnnaas.inference.settings import execution_settings
    from gnnaas.serving.core.settings import Settings

    if settings is None:
        defaults = Settings()
        settings = {
            **execution_settings("cpu", inline_max_nodes=defaults.inline_max_nodes),
            "threads": defaults.torch_threads,
        }
    from pathlib import Path

    from gnnaas.models import build_model
    from gnnaas.profiling.table import (
        PROFILE_COLUMNS,
        write_profiles,
        write_service_times,
    )
    from gnnaas.variants.repository import MANIFEST_FORMAT, Manifest, VariantRepository

    variants_dir, profiles_dir = Path(root) / "variants", Path(root) / "profiles"
    repo = VariantRepository(variants_dir)
    profile_rows, service_rows = [], []
    for variant_id, (prune, accuracy, e2e) in variants.items():
        arch, ranking, _ = variant_id.split("-")
        kept = list(range(0, store.num_features, prune))[: store.num_features // prune]
        torch.manual_seed(prune)
        model = build_model(arch, len(kept), 16, store.num_classes)
        manifest = Manifest(
            format=MANIFEST_FORMAT,
            dataset=store.name,
            variant_id=variant_id,
            arch=arch,
            ranking=ranking,
            prune=prune,
            num_features=store.num_features,
            kept_features=kept,
            in_channels=len(kept),
            hidden_channels=16,
            out_channels=store.num_classes,
            num_layers=2,
            dropout=0.5,
            fanouts=[5, 3],
            multi_label=False,
            metrics={"val_acc": accuracy / 100, "test_acc": accuracy / 100},
            seed=0,
        )
        repo.save(manifest, model)
        if profiled is not None and variant_id not in profiled:
            continue
        for split in ("val", "test"):
            row: dict[str, Any] = dict.fromkeys(PROFILE_COLUMNS, 1.0)
            row.update(
                dataset=store.name, variant=variant_id, arch=arch, ranking=ranking, prune=prune,
                features_kept=len(kept), split=split, batch_size=1024, num_batches=2,
                accuracy=accuracy - (split == "test"), latency_ms=e2e[-1], e2e_ms=e2e[-1],
                device="cpu", threads=2, torch_version=torch.__version__,
                date="2099-01-01T00:00:00Z",
            )  # fmt: skip
            profile_rows.append(row)
        for batch_size, ms in zip((1, 32, 256, 1024), e2e, strict=True):  # any sizes do
            service_rows.append(
                {"variant": variant_id, "batch_size": batch_size, "sample_ms": ms / 4,
                 "gather_ms": ms / 4, "compute_ms": ms / 2, "e2e_ms": ms, "sampling": "depth",
                 "sampler_seed": 0, **settings}
            )  # fmt: skip
    write_profiles(profile_rows, profiles_dir / store.name)
    write_service_times(service_rows, profiles_dir / store.name)
    return variants_dir, profiles_dir


def toy_registry_factory(settings: Any) -> VariantRegistry:
    """A fresh toy registry of ``settings.datasets`` (``toy`` and/or ``ring``; the Ray replicas
    and the ``--workers`` processes build it in their process)."""
    return make_toy_registry(datasets=tuple(settings.datasets or ("toy",)))[0]


def toy_worker_app() -> Any:
    """The app of one ``--workers`` process over the toy registry (settings from ``GNNAAS_*``)."""
    from gnnaas.serving import Settings, create_app

    settings = Settings()
    return create_app(settings, registry=toy_registry_factory(settings))


class _HangingModel(torch.nn.Module):
    """A model that hangs once, so that a request is surely running when its replica is killed.

    Once ``armed`` exists (the test creates it) the next forward pass writes ``marker`` and
    hangs for ``hold_s``; passes before (the replica's warm-up) and after go through.

    Args:
        inner (FakeModel): the model wrapped.
        armed (str): the file whose existence arms the hang.
        marker (str): the file the hanging pass writes.
        hold_s (float): how long it hangs.
    """

    def __init__(self, inner: FakeModel, armed: str, marker: str, hold_s: float) -> None:
        super().__init__()
        self.inner = inner
        self.num_layers = inner.num_layers
        self.in_channels = inner.in_channels
        self.armed, self.marker, self.hold_s = armed, marker, hold_s

    def forward(
        self, x: Tensor, blocks: list[Any], *, embed: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        if os.path.exists(self.armed):
            try:
                with open(self.marker, "x") as f:  # the first armed pass only
                    f.write("in flight\n")
                threading.Event().wait(self.hold_s)  # hangs this batch, not the test
            except FileExistsError:
                pass
        return self.inner(x, blocks, embed=embed)


def hanging_toy_registry_factory(
    armed: str, marker: str, hold_s: float, settings: Any
) -> VariantRegistry:
    """The toy registry whose ``sage-full-1x`` is a :class:`_HangingModel`.

    Bind ``armed``, ``marker`` and ``hold_s`` with :func:`functools.partial`; Ray's replicas call
    the rest as a registry factory.

    Returns:
        VariantRegistry: the toy registry.
    """
    registry, models = make_toy_registry()
    toy = registry.get("toy")
    assert toy is not None
    toy.variants["sage-full-1x"].model = _HangingModel(
        models["sage-full-1x"], armed, marker, hold_s
    )
    return registry
