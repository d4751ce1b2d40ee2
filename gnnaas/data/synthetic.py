"""Synthetic graphs: a contextual stochastic block model with skewed degrees.

Nodes fall into blocks (the classes). Each undirected edge picks one endpoint with probability
proportional to a power-law node weight (Chung–Lu) and the other, with probability ``homophily``,
inside the first one's block, else in another block, again proportional to weight. Node features
are Gaussian noise plus the block's mean vector, whose strength differs per column
(:func:`column_signal`): a seeded random subset of strong columns (``GraphStore.informative``, the
ground truth that feature rankings must recover), optionally a tier of weak columns whose signal
falls off, and pure noise on the rest. With a weak tier, more columns carry signal than an 8×
pruned model keeps, so pruning costs accuracy (graded: most at 8×) while a random ranking, which
misses most strong columns, costs much more. Multi-label graphs (yelp) draw a few labels per node
from its block's favourite labels plus rare background labels.
On dense graphs (reddit, products) averaging dozens of homophilous neighbors recovers the block
almost surely, so a share of their labels is redrawn at random (``label_noise``) to keep the task
short of 100% accuracy.

Signals were tuned so that a 2-layer GNN lands well above chance but short of perfect, and well
above an MLP on the same features (neighbor aggregation helps); the accuracies of every variant
are in ``benchmarks/results/variants-synth-*.md``.

Everything is vectorized and O(N + E) in time and memory; the same seed gives the same tensors.

Presets mirror the graphs of the reference study (docs/architecture.md §3). Edge counts are stored
(directed) CSR entries after symmetrization, dedupe and self-loop removal, so they land near,
not exactly on, the preset.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from torch import Tensor

from gnnaas.data.splits import stratified_split
from gnnaas.data.store import GraphStore
from gnnaas.errors import ConfigError
from gnnaas.utils import new_file_mode

__all__ = [
    "GENERATOR_VERSION",
    "PRESETS",
    "SyntheticConfig",
    "column_signal",
    "load_synthetic",
    "make_synthetic",
    "parse_synthetic_name",
    "stored_edges",
]

_log = logging.getLogger(__name__)

#: bump when the generator's output for a given (config, seed) changes; part of the cache key
GENERATOR_VERSION = 2

#: graphs with more than this many feature entries plus edges are cached on disk once built
_CACHE_MIN_SIZE = 50_000_000


@dataclass(frozen=True)
class SyntheticConfig:
    """Parameters of a synthetic graph.

    Args:
        num_nodes (int): number of nodes ``N``.
        num_edges (int): target number of stored directed edges ``E`` (each undirected edge
            counts twice) after dedupe and self-loop removal.
        num_features (int): feature columns ``F``.
        num_classes (int): classes ``C`` (labels per node when ``multi_label``).
        multi_label (bool, optional): ``y`` is ``[N, C]`` 0/1. (default: :obj:`False`)
        num_blocks (int, optional): blocks of the block model; the classes when single-label,
            ``max(2, C // 4)`` when multi-label. (default: :obj:`None`)
        homophily (float, optional): fraction of edges inside a block. (default: ``0.75``)
        degree_exponent (float, optional): power-law exponent of the node weights; smaller is
            more skewed. (default: ``2.5``)
        max_degree_factor (float, optional): caps a node's expected degree at
            ``max_degree_factor * sqrt(E)``. (default: ``1.0``)
        num_informative (int, optional): informative feature columns; default
            ``min(max(4, F // 10), max(1, F // 8))`` so an 8× pruned model can keep them all.
            (default: :obj:`None`)
        signal (float, optional): standard deviation of the block means on informative columns.
            (default: ``0.3``)
        noise (float, optional): standard deviation of the Gaussian noise on every column.
            (default: ``1.0``)
        class_skew (float, optional): block sizes follow ``(b + 1) ** -class_skew``.
            (default: ``0.5``)
        labels_per_block (int, optional): multi-label only: favourite labels of each block, each
            held with probability ``0.8``. (default: ``3``)
        label_noise (float, optional): single-label only: share of nodes whose label is redrawn
            uniformly, which caps the reachable accuracy near ``1 - label_noise``; high-degree
            graphs need it, as averaging many homophilous neighbors recovers the block almost
            surely. (default: ``0.0``)
        num_weak (int, optional): weakly informative columns besides the informative ones; the
            ``i``-th carries block means of standard deviation falling linearly from
            ``weak_signal`` to ``weak_signal / 2``, so the class signal is spread over more columns
            than a pruned model keeps and pruning costs accuracy, most at 8×. (default: ``0``)
        weak_signal (float, optional): standard deviation of the block means on the strongest
            weak column; must stay below ``signal``. (default: ``0.0``)
    """

    num_nodes: int
    num_edges: int
    num_features: int
    num_classes: int
    multi_label: bool = False
    num_blocks: int | None = None
    homophily: float = 0.75
    degree_exponent: float = 2.5
    max_degree_factor: float = 1.0
    num_informative: int | None = None
    signal: float = 0.3
    noise: float = 1.0
    class_skew: float = 0.5
    labels_per_block: int = 3
    label_noise: float = 0.0
    num_weak: int = 0
    weak_signal: float = 0.0

    def __post_init__(self) -> None:
        checks = [
            ("num_nodes", self.num_nodes >= 2),
            ("num_edges", self.num_edges >= 0),
            ("num_features", self.num_features >= 1),
            ("num_classes", self.num_classes >= 2),
            ("homophily", 0.0 <= self.homophily <= 1.0),
            ("degree_exponent", self.degree_exponent > 1.0),
            ("max_degree_factor", self.max_degree_factor > 0.0),
            ("signal", self.signal >= 0.0),
            ("noise", self.noise >= 0.0),
            ("label_noise", 0.0 <= self.label_noise <= 1.0),
            ("num_weak", self.num_weak >= 0),
            ("weak_signal", 0.0 <= self.weak_signal < max(self.signal, 1e-12)),
        ]
        for arg, ok in checks:
            if not ok:
                raise ValueError(f"SyntheticConfig: invalid {arg} (got {getattr(self, arg)!r})")
        m = self.informative_count
        if not 1 <= m <= self.num_features:
            raise ValueError(
                f"SyntheticConfig: num_informative must lie in [1, {self.num_features}] (got {m})"
            )
        if m + self.num_weak > self.num_features:
            raise ValueError(
                f"SyntheticConfig: num_informative + num_weak must not exceed num_features "
                f"{self.num_features} (got {m} + {self.num_weak})"
            )

    @property
    def informative_count(self) -> int:
        """The number of informative feature columns."""
        if self.num_informative is not None:
            return self.num_informative
        f = self.num_features
        return min(max(4, f // 10), max(1, f // 8))

    @property
    def block_count(self) -> int:
        """The number of blocks of the block model."""
        if self.num_blocks is not None:
            return self.num_blocks
        return max(2, self.num_classes // 4) if self.multi_label else self.num_classes

    def scaled(self, scale: float) -> SyntheticConfig:
        """Nodes and edges times ``scale`` (mean degree, features and classes unchanged)."""
        return replace(
            self,
            num_nodes=max(2, round(self.num_nodes * scale)),
            num_edges=round(self.num_edges * scale),
        )


#: nodes / edges / features / classes of the reference study's graphs, plus a small one
PRESETS: dict[str, SyntheticConfig] = {
    # small, flickr, arxiv: a few strong columns plus a weak tier over every other column, so that
    # the 1× model is the most accurate and 8× greedy/lasso lose a few points (calibrated with
    # benchmarks/bench_calibration.py)
    "small": SyntheticConfig(
        3_000, 30_000, 64, 5, signal=0.35, num_informative=4, num_weak=60, weak_signal=0.15
    ),
    "flickr": SyntheticConfig(
        89_250, 899_756, 500, 7, signal=0.16, num_informative=20, num_weak=480, weak_signal=0.05
    ),
    "arxiv": SyntheticConfig(
        169_343, 1_166_243, 128, 40, signal=0.45, num_informative=10, num_weak=118, weak_signal=0.16
    ),
    "reddit": SyntheticConfig(232_965, 11_606_919, 602, 41, signal=0.05, label_noise=0.12),
    "yelp": SyntheticConfig(716_847, 6_977_410, 300, 100, multi_label=True, signal=0.3),
    "products": SyntheticConfig(2_449_029, 61_859_140, 100, 47, signal=0.3, label_noise=0.15),
}

_NAME = re.compile(r"^synth-([a-z]+)(?:@([0-9.eE+-]+))?$")


def parse_synthetic_name(name: str) -> tuple[str, float, str]:
    """Splits ``synth-<preset>[@<scale>]`` (case-insensitive) into preset, scale, canonical name.

    Example:
        >>> parse_synthetic_name("Synth-Reddit@0.10")
        ('reddit', 0.1, 'synth-reddit@0.1')
    """
    match = _NAME.match(name.strip().lower())
    if match is None or match.group(1) not in PRESETS:
        known = ", ".join(f"synth-{p}" for p in PRESETS)
        raise ConfigError(
            f"unknown synthetic dataset '{name}'; known presets: {known} "
            "(optionally with @<scale>, e.g. synth-reddit@0.1)"
        )
    preset, raw_scale = match.group(1), match.group(2)
    scale = 1.0
    if raw_scale is not None:
        try:
            scale = float(raw_scale)
        except ValueError:
            scale = float("nan")
        if not (math.isfinite(scale) and 0.0 < scale <= 10.0):
            raise ConfigError(
                f"dataset '{name}': scale must be a number in (0, 10] (got '{raw_scale}'); "
                "e.g. synth-reddit@0.1"
            )
    canonical = f"synth-{preset}" if scale == 1.0 else f"synth-{preset}@{scale:g}"
    return preset, scale, canonical


def _block_sizes_probs(cfg: SyntheticConfig) -> Tensor:
    p = torch.arange(1, cfg.block_count + 1, dtype=torch.float64).pow(-cfg.class_skew)
    return p / p.sum()


def _node_weights(cfg: SyntheticConfig, gen: torch.Generator) -> Tensor:
    """Pareto weights (min 1), capped so that no expected degree exceeds factor·sqrt(E)."""
    u = torch.rand(cfg.num_nodes, generator=gen, dtype=torch.float64)
    w = (1.0 - u).pow(-1.0 / (cfg.degree_exponent - 1.0))
    if cfg.num_edges > 0:
        # expected degree of node i is about E * w_i / sum(w)
        cap = cfg.max_degree_factor * math.sqrt(cfg.num_edges) * float(w.sum()) / cfg.num_edges
        w.clamp_(max=max(cap, 1.0))
    return w


def _draw_pairs(
    count: int,
    cum: Tensor,
    block_of_pos: Tensor,
    lo: Tensor,
    mass: Tensor,
    end: Tensor,
    homophily: float,
    gen: torch.Generator,
) -> tuple[Tensor, Tensor]:
    """Draws ``count`` endpoint pairs as positions in the block-sorted node order."""
    total = float(cum[-1])
    last = cum.numel() - 1
    r = torch.rand(count, generator=gen, dtype=torch.float64).mul_(total)
    u_pos = torch.searchsorted(cum, r, right=True, out_int32=True).clamp_(max=last)
    bu = block_of_pos[u_pos].long()
    intra = torch.rand(count, generator=gen) < homophily
    r = torch.rand(count, generator=gen, dtype=torch.float64, out=r)
    # intra: uniform over the block's weight range; inter: over everything else.
    r.mul_(torch.where(intra, mass[bu], total - mass[bu]))
    r.add_(torch.where(intra, lo[bu], mass[bu] * (r >= lo[bu])))
    v_pos = torch.searchsorted(cum, r, right=True, out_int32=True).clamp_(max=last)
    del r
    v_pos = torch.where(intra, torch.minimum(v_pos, end[bu] - 1), v_pos)
    return u_pos, v_pos


def _edges(cfg: SyntheticConfig, block: Tensor, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """Symmetric, deduplicated, loop-free CSR (over incoming edges) of the block model."""
    n = cfg.num_nodes
    w = _node_weights(cfg, gen)
    block_sorted, order = block.sort(stable=True)
    order32 = order.int()
    del order
    cum = torch.cumsum(w[order32], 0)  # float64: float32 would starve low-weight nodes
    del w
    end = torch.cumsum(torch.bincount(block_sorted, minlength=cfg.block_count), 0)
    bounds = torch.cat([cum.new_zeros(1), cum])[torch.cat([end.new_zeros(1), end])]
    lo, mass = bounds[:-1], bounds.diff()  # [B] weight range of each block in `cum`
    end = end.int()
    block_of_pos = block_sorted.to(torch.int16 if cfg.block_count < 2**15 else torch.int32)
    del block_sorted

    target = cfg.num_edges // 2  # undirected pairs
    keys = torch.empty(0, dtype=torch.long)
    draw = target
    for _ in range(4):  # the first draw misses only duplicates and self loops; top them up
        u_pos, v_pos = _draw_pairs(draw, cum, block_of_pos, lo, mass, end, cfg.homophily, gen)
        u, v = order32[u_pos].long(), order32[v_pos].long()
        del u_pos, v_pos
        loop = u == v
        lo_id, hi_id = torch.minimum(u, v), torch.maximum(u, v)
        del u, v
        new = lo_id.mul_(n).add_(hi_id)[~loop]  # undirected key a * n + b with a < b
        del hi_id, lo_id, loop
        before = keys.numel()
        keys = torch.unique(torch.cat([keys, new]))
        del new
        gained = keys.numel() - before
        missing = target - keys.numel()
        if missing <= 0.002 * target or gained <= 0:
            break
        draw = math.ceil(missing * draw / gained * 1.02)
    if keys.numel() > target:  # trim the overshoot at random, keeping the key order
        drop = torch.randperm(keys.numel(), generator=gen)[: keys.numel() - target]
        keep = torch.ones(keys.numel(), dtype=torch.bool)
        keep[drop] = False
        keys = keys[keep]
        del keep, drop

    # key = a * n + b with a < b; the reverse edge is b * n + a. Sorted keys of (target, source).
    src_hi = keys % n
    both = torch.cat([keys, src_hi.mul_(n).add_(keys.div(n, rounding_mode="floor"))])
    del keys, src_hi
    both = both.sort().values
    rowptr = torch.searchsorted(both, torch.arange(n + 1, dtype=torch.long) * n)
    col = both.remainder_(n)
    return rowptr, col


def column_signal(cfg: SyntheticConfig, seed: int = 0) -> Tensor:
    """Per feature column, the standard deviation of its block means (0 on pure-noise columns).

    The informative columns carry ``signal``, the weak ones from ``weak_signal`` down to half of
    it; which column is which is a seeded permutation, drawn from its own generator
    so that this costs nothing next to building the graph.

    Args:
        cfg (SyntheticConfig): the graph's parameters.
        seed (int, optional): the graph's seed. (default: ``0``)

    Returns:
        Tensor: ``[F]`` float32.

    Example:
        >>> strength = column_signal(PRESETS["small"])
        >>> int((strength == PRESETS["small"].signal).sum()) == PRESETS["small"].informative_count
        True
    """
    m, w = cfg.informative_count, cfg.num_weak
    perm = _column_order(cfg, seed)
    strength = torch.zeros(cfg.num_features)
    strength[perm[:m]] = cfg.signal
    strength[perm[m : m + w]] = cfg.weak_signal * (1.0 - 0.5 * torch.arange(w) / max(w - 1, 1))
    return strength


def _column_order(cfg: SyntheticConfig, seed: int) -> Tensor:
    """Columns from strongest to weakest: informative, then weak, then noise."""
    gen = torch.Generator().manual_seed(seed + 0x5EED)
    return torch.randperm(cfg.num_features, generator=gen)


def _features(
    cfg: SyntheticConfig, block: Tensor, gen: torch.Generator, seed: int
) -> tuple[Tensor, Tensor]:
    """Noise everywhere plus the block means, scaled per column by :func:`column_signal`."""
    strength = column_signal(cfg, seed)
    informative = _column_order(cfg, seed)[: cfg.informative_count].sort().values
    used = (strength > 0).nonzero().flatten()
    # block means with exactly the column's standard deviation (weighted by block size), so
    # the ground-truth order of the columns is the order of their strengths, not a draw's luck
    means = torch.randn(cfg.block_count, used.numel(), generator=gen)
    p = _block_sizes_probs(cfg).float().unsqueeze(1)  # [B, 1]
    means -= (p * means).sum(0)
    means *= strength[used] / (p * means.square()).sum(0).sqrt().clamp(min=1e-12)
    x = torch.randn(cfg.num_nodes, cfg.num_features, generator=gen)
    if cfg.noise != 1.0:
        x.mul_(cfg.noise)
    x[:, used] += means[block.long()]  # [N, m + w]
    return x, informative


def _labels(cfg: SyntheticConfig, block: Tensor, gen: torch.Generator) -> Tensor:
    if not cfg.multi_label:
        y = block.clone()  # a copy: `block` stays the ground truth of edges and features
        if cfg.label_noise > 0:
            flip = torch.rand(cfg.num_nodes, generator=gen) < cfg.label_noise
            y[flip] = torch.randint(cfg.num_classes, (int(flip.sum()),), generator=gen)
        return y
    b, c = cfg.block_count, cfg.num_classes
    k = min(cfg.labels_per_block, c)
    favourite = torch.rand(b, c, generator=gen).argsort(dim=1)[:, :k]  # [B, k]
    prob = torch.full((b, c), 1.0 / c)
    prob.scatter_(1, favourite, 0.8)
    return (torch.rand(cfg.num_nodes, c, generator=gen) < prob[block.long()]).float()  # [N, C]


def make_synthetic(cfg: SyntheticConfig, name: str = "synthetic", *, seed: int = 0) -> GraphStore:
    """Builds a synthetic graph (no caching; see :func:`gnnaas.data.load_dataset`).

    Args:
        cfg (SyntheticConfig): the graph's parameters.
        name (str, optional): the dataset's name. (default: ``"synthetic"``)
        seed (int, optional): seed of every random draw. (default: ``0``)

    Returns:
        GraphStore: a symmetric graph without self loops or duplicate edges, with a seeded
        stratified 60/20/20 split and ``informative`` set.

    Example:
        >>> store = make_synthetic(PRESETS["small"], "synth-small", seed=0)
        >>> store.num_nodes, store.num_features
        (3000, 64)
    """
    gen = torch.Generator().manual_seed(seed)
    p = _block_sizes_probs(cfg)
    block = torch.multinomial(p, cfg.num_nodes, replacement=True, generator=gen)
    rowptr, col = _edges(cfg, block, gen)
    x, informative = _features(cfg, block, gen, seed)
    y = _labels(cfg, block, gen)
    train, val, test = stratified_split(block, seed=seed)
    return GraphStore(
        name=name,
        rowptr=rowptr,
        col=col,
        x=x,
        y=y,
        num_classes=cfg.num_classes,
        multi_label=cfg.multi_label,
        train_idx=train,
        val_idx=val,
        test_idx=test,
        informative=informative,
        source="synthetic",
    )


def _cache_file(cache_dir: Path, name: str, seed: int) -> Path:
    safe = name.replace("@", "_at_")
    return cache_dir / "synthetic" / f"{safe}-seed{seed}-v{GENERATOR_VERSION}.safetensors"


def load_synthetic(name: str, *, seed: int = 0, cache_dir: Path | None = None) -> GraphStore:
    """Builds ``synth-<preset>[@<scale>]``, reusing a safetensors copy in ``cache_dir`` if any.

    Only large graphs are cached; the file is keyed by name, seed and :data:`GENERATOR_VERSION`.
    """
    preset, scale, canonical = parse_synthetic_name(name)
    cfg = PRESETS[preset].scaled(scale)
    if cfg.num_nodes < 4 * cfg.block_count:
        raise ConfigError(
            f"dataset '{name}': scale {scale:g} leaves {cfg.num_nodes} nodes for "
            f"{cfg.block_count} classes; use a larger scale"
        )
    big = cfg.num_nodes * cfg.num_features + cfg.num_edges > _CACHE_MIN_SIZE
    path = _cache_file(cache_dir, canonical, seed) if cache_dir is not None and big else None
    if path is not None and path.is_file():
        store = _read_cached(path, canonical, cfg, seed)
        if store is not None:
            return store
    _log.info(
        "building %s (seed %d): %d nodes, ~%d edges", canonical, seed, cfg.num_nodes, cfg.num_edges
    )
    store = make_synthetic(cfg, canonical, seed=seed)
    if path is not None:
        _write_cached(path, store, cfg, seed)
    elif cache_dir is not None:
        _write_counts(cache_dir, canonical, cfg, seed, store.num_edges)
    return store


def _counts_file(cache_dir: Path, name: str, seed: int) -> Path:
    return _cache_file(cache_dir, name, seed).with_suffix(".json")


def _write_counts(cache_dir: Path, name: str, cfg: SyntheticConfig, seed: int, edges: int) -> None:
    """Records a built graph that is too small to cache: its stored edge count, for
    :func:`stored_edges` (``gnnaas datasets``)."""
    path = _counts_file(cache_dir, name, seed)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"config": repr(asdict(cfg)), "num_edges": int(edges)}))
        os.replace(tmp, path)
    except OSError as exc:  # only costs `gnnaas datasets` the exact count
        _log.debug("could not record the edges of %s in %s: %s", name, path.parent, exc)
        tmp.unlink(missing_ok=True)


def stored_edges(name: str, *, seed: int = 0, cache_dir: Path | None = None) -> int | None:
    """The stored edge count of ``synth-<preset>[@<scale>]`` as built with ``seed``, without
    building it: from the cached graph's header, or the count recorded when a graph too small to
    cache was built; ``None`` when neither is in ``cache_dir`` (the preset's ``num_edges`` is then
    only the target: the generator stops within 0.2% of it, duplicates and self loops dropped).

    Example:
        >>> stored_edges("synth-small", cache_dir=Path("/nonexistent")) is None
        True
    """
    if cache_dir is None:
        return None
    preset, scale, canonical = parse_synthetic_name(name)
    cfg = PRESETS[preset].scaled(scale)
    counts = _counts_file(cache_dir, canonical, seed)
    try:
        record = json.loads(counts.read_text())
        if record.get("config") == repr(asdict(cfg)):
            return int(record["num_edges"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    cached = _cache_file(cache_dir, canonical, seed)
    if not cached.is_file():
        return None
    from safetensors import safe_open

    try:
        with safe_open(str(cached), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("config") != repr(asdict(cfg)) or meta.get("seed") != str(seed):
                return None
            return int(f.get_slice("col").get_shape()[0])
    except Exception:  # a corrupt cache file is rebuilt at the next load
        return None


def _read_cached(path: Path, name: str, cfg: SyntheticConfig, seed: int) -> GraphStore | None:
    from safetensors import safe_open
    from safetensors.torch import load_file

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        if meta.get("config") != repr(asdict(cfg)) or meta.get("seed") != str(seed):
            return None
        t = load_file(str(path))
        return GraphStore(
            name=name,
            rowptr=t["rowptr"],
            col=t["col"],
            x=t["x"],
            y=t["y"],
            num_classes=cfg.num_classes,
            multi_label=cfg.multi_label,
            train_idx=t["train_idx"],
            val_idx=t["val_idx"],
            test_idx=t["test_idx"],
            informative=t["informative"],
            source="synthetic",
        )
    except Exception as exc:  # a corrupt or foreign cache file is rebuilt, never trusted
        _log.warning("ignoring unreadable cache file %s: %s", path, exc)
        return None


def _write_cached(path: Path, store: GraphStore, cfg: SyntheticConfig, seed: int) -> None:
    from safetensors.torch import save_file

    assert store.informative is not None
    tensors = {
        "rowptr": store.rowptr,
        "col": store.col,
        "x": store.x,
        "y": store.y,
        "train_idx": store.train_idx,
        "val_idx": store.val_idx,
        "test_idx": store.test_idx,
        "informative": store.informative,
    }
    meta = {
        "name": store.name,
        "seed": str(seed),
        "config": repr(asdict(cfg)),
        "generator_version": str(GENERATOR_VERSION),
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(tmp), metadata=meta)
        os.chmod(tmp, new_file_mode())  # safetensors writes 0600
        os.replace(tmp, path)
    except OSError as exc:  # a full or read-only cache only costs a rebuild next time
        _log.warning("could not cache %s in %s: %s", store.name, path.parent, exc)
        tmp.unlink(missing_ok=True)
