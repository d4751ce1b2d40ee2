"""Variant axes beyond the kept features: serving fanouts, hidden width and precision.

A trained variant (``<arch>-<ranking>-<k>x``) is the root of cheaper variants that cost no or
little training:

- **fanouts** (``-f10.5``): the same weights sampled with smaller fanouts. Fewer sampled nodes,
  so less gather and less first-layer compute; no training. Fanouts that would sample about as
  many rows as the training fanouts on this graph (low-degree graphs, where they rarely bind)
  are not generated (:func:`binding_fanouts`).
- **hidden width** (``-h128``): a narrower model of the same kept features *distilled* from the
  variant (:func:`gnnaas.variants.training.train_model` with ``teacher``). Both layers' compute
  shrinks with the width, and a student that learned the teacher's answers agrees with it on
  most nodes, so its paired accuracy interval is tight (what small tolerances admit).
- **precision** (``-int8``): the linear layers quantized to int8 at load
  (:func:`gnnaas.models.quantize.quantize_int8`, CPU) with input ranges calibrated on sampled
  training batches and stored in the manifest (fixed ranges: a node's answer does not depend on
  its batch-mates); generated only where it is measured faster than fp32 on this graph and
  machine (:func:`int8_speedup`). Each base is measured once: the decision, kept or not, is
  recorded beside the variants (:mod:`gnnaas.variants.decisions`) and reused while the base's
  weights and fanouts are unchanged, so a second run neither times again nor changes the set
  (``force`` decides anew).

:func:`derive_variants` applies the axes to the variants near the most accurate one (the dense
frontier that small tolerances need) and stores each one with its ``axes``, its ``base`` and its
accuracy measured through the serving path. Which variants are then worth routing is the
router's and the report's business (dominance on the profiles, :mod:`gnnaas.policy`).
"""

from __future__ import annotations

import datetime as _dt
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gnnaas.errors import ArtifactError, ConfigError

# Only the standard library at import: the CLI builds its options from this module's constants
# without loading torch (`gnnaas --help` stays fast).
if TYPE_CHECKING:
    from torch import Tensor

    from gnnaas.data import GraphStore
    from gnnaas.models import GNN
    from gnnaas.variants.decisions import Int8Decisions
    from gnnaas.variants.manifest import Manifest, VariantSpec
    from gnnaas.variants.repository import VariantRepository
    from gnnaas.variants.training import EpochReport, TrainConfig

__all__ = [
    "AXES",
    "DEFAULT_AXES",
    "DEFAULT_NEAR",
    "DEFAULT_WIDTH_DIVISORS",
    "DerivedRow",
    "binding_fanouts",
    "derive_variants",
    "distilled_widths",
    "fanout_candidates",
    "int8_speedup",
    "parse_axes",
]

_log = logging.getLogger(__name__)

AXES = ("features", "width", "fanouts", "precision")
"""The axes ``gnnaas generate --axes`` accepts: kept features (trained variants), distilled
widths, serving fanouts and int8 precision."""
DEFAULT_AXES = AXES
"""Every axis (``generate``'s default plan)."""
DEFAULT_NEAR = 2.0
"""Trained variants within this many validation points of the most accurate one get fanout and
width variants (at most :data:`_MAX_ROOTS_PER_ARCH` per architecture)."""
DEFAULT_WIDTH_DIVISORS = (2, 4)
"""Distilled widths: the teacher's hidden width divided by each of these."""

_MAX_ROOTS_PER_ARCH = 2
_MAX_FANOUT_SETS = 2
_BINDING_RATIO = 0.85  # a fanout set must sample at most this share of the rows of the previous
_NICE_FANOUTS = (100, 50, 25, 15, 10, 5, 3, 2)
_FANOUT_STEP = 0.7  # each step takes the largest ladder value at most this share of the current
_PROBE_SEEDS = 256
_INT8_MIN_SPEEDUP = 1.1
_CALIBRATION_SEEDS = 256
_CALIBRATION_BATCHES = 8
_INT8_PROBE_RUNS = 5


@dataclass(frozen=True)
class DerivedRow:
    """One derived variant of ``gnnaas generate``'s summary.

    Args:
        variant_id (str): e.g. ``gin-full-1x-h128-int8``.
        base (str): the variant it derives from.
        features_kept (int): input features it reads.
        val_acc (float): validation accuracy in [0, 1] through the serving path.
        seconds (float): time to derive it (distillation, or evaluation).
        status (str): ``"distilled"``, ``"derived"`` (other fanouts or precision of the same
            weights) or ``"skipped"`` (an existing one matched).
    """

    variant_id: str
    base: str
    features_kept: int
    val_acc: float
    seconds: float
    status: str


def parse_axes(values: Sequence[str]) -> tuple[str, ...]:
    """The axes named in ``values`` (any case, commas allowed), in :data:`AXES` order.

    Raises:
        ConfigError: an unknown axis, or ``features`` missing (every other axis derives from
            trained variants).

    Example:
        >>> parse_axes(["fanouts", "features"])
        ('features', 'fanouts')
    """
    names = {p.strip().lower() for v in values for p in str(v).split(",") if p.strip()}
    unknown = sorted(names - set(AXES))
    if unknown:
        raise ConfigError(f"unknown axis {unknown[0]!r}; choose among {', '.join(AXES)}")
    if "features" not in names:
        raise ConfigError(
            "the axes must include features (the trained variants every other axis derives from)"
        )
    return tuple(a for a in AXES if a in names)


def fanout_candidates(train_fanouts: Sequence[int], limit: int = 4) -> list[tuple[int, ...]]:
    """Smaller serving fanouts to try, from the training fanouts: each step lowers the largest
    fanout (the outermost hop on ties) to the largest value of a fixed ladder (50, 25, 15, 10, 5,
    3, 2) at most 0.7 of it, so the seeds' own neighbors are cut last.

    Example:
        >>> fanout_candidates((25, 10))
        [(15, 10), (10, 10), (10, 5), (5, 5)]
    """
    current = [int(f) for f in train_fanouts]
    if any(f < 1 for f in current):
        return []  # full neighborhoods (-1): nothing smaller to name
    out: list[tuple[int, ...]] = []
    while len(out) < limit:
        top = max(current)
        lower = [n for n in _NICE_FANOUTS if n <= _FANOUT_STEP * top]
        if not lower:
            break
        hop = max(i for i, f in enumerate(current) if f == top)  # ties: the outermost hop
        current[hop] = lower[0]
        out.append(tuple(current))
    return out


def _sampled_rows(store: GraphStore, fanouts: Sequence[int], seeds: Tensor, seed: int) -> int:
    from gnnaas.runtime import RuntimeGraph

    sampler = RuntimeGraph(store, seed=seed).sampler(fanouts)
    return int(sampler.sample(seeds).n_id.numel())


def binding_fanouts(
    store: GraphStore,
    train_fanouts: Sequence[int],
    *,
    sampler_seed: int = 0,
    limit: int = _MAX_FANOUT_SETS,
) -> list[tuple[int, ...]]:
    """The smaller serving fanouts worth a variant on ``store``: each samples at most
    :data:`_BINDING_RATIO` of the rows of the previous kept set (the training fanouts first),
    measured with the serving sampler on a fixed draw of nodes. On a graph whose degrees are
    mostly below the fanouts, smaller fanouts change little and none is kept.

    Args:
        store (GraphStore): the graph.
        train_fanouts (Sequence[int]): the variant's training fanouts (PyG order).
        sampler_seed (int, optional): the serving sampler's seed. (default: ``0``)
        limit (int, optional): at most this many sets. (default: ``2``)

    Returns:
        list[tuple[int, ...]]: the kept fanout sets, largest first.
    """
    import torch

    if store.num_nodes == 0:
        return []
    gen = torch.Generator().manual_seed(0)
    seeds = torch.randperm(store.num_nodes, generator=gen)[: min(_PROBE_SEEDS, store.num_nodes)]
    seeds = seeds.sort().values
    previous = _sampled_rows(store, train_fanouts, seeds, sampler_seed)
    kept: list[tuple[int, ...]] = []
    for fanouts in fanout_candidates(train_fanouts):
        rows = _sampled_rows(store, fanouts, seeds, sampler_seed)
        if rows <= _BINDING_RATIO * previous:
            kept.append(fanouts)
            previous = rows
            if len(kept) >= limit:
                break
    return kept


def _median_ms(fn: Callable[[], Any], runs: int) -> float:
    from gnnaas.stats import median  # numpy: this module imports only the standard library

    fn()  # warm-up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return median(times)


def int8_speedup(
    model: GNN, store: GraphStore, keep: Sequence[int], fanouts: Sequence[int]
) -> float:
    """fp32 time / int8 time of ``model``'s forward on a sampled batch of this graph.

    Times the forward alone (gather and sampling are the same for both) on one fixed batch of
    up to 256 seeds, median of a few runs each, alternated.

    Returns:
        float: the speed-up; ``0.0`` when int8 cannot run here.
    """
    import torch

    from gnnaas.models.quantize import calibrate_int8, int8_available, quantize_int8
    from gnnaas.runtime import RuntimeGraph

    if not int8_available():
        return 0.0
    gen = torch.Generator().manual_seed(1)
    seeds = torch.randperm(store.num_nodes, generator=gen)[: min(_PROBE_SEEDS, store.num_nodes)]
    sub = RuntimeGraph(store).sampler(fanouts).sample(seeds.sort().values)
    x = store.feature_subset(list(keep))[sub.n_id]  # [N_s, F_kept]
    blocks = list(sub.blocks)
    quantized = quantize_int8(model.eval(), calibrate_int8(model, [(x, blocks)]))
    with torch.inference_mode():
        fp32 = _median_ms(lambda: model(x, blocks), _INT8_PROBE_RUNS)
        int8 = _median_ms(lambda: quantized(x, blocks), _INT8_PROBE_RUNS)
        fp32 = min(fp32, _median_ms(lambda: model(x, blocks), _INT8_PROBE_RUNS))
    return fp32 / max(int8, 1e-9)


def _calibration_batches(
    store: GraphStore, keep: Sequence[int], fanouts: Sequence[int], seed: int
) -> list[tuple[Tensor, list[Any]]]:
    """Sampled batches of training nodes on the full graph, as the variant is served (its
    fanouts: a GIN's sums grow with them), for int8 calibration."""
    import torch

    from gnnaas.runtime import RuntimeGraph

    nodes = store.train_idx if store.train_idx.numel() else torch.arange(store.num_nodes)
    order = torch.randperm(nodes.numel(), generator=torch.Generator().manual_seed(0))
    sampler = RuntimeGraph(store, seed=seed).sampler(fanouts)
    features = store.feature_subset(list(keep))
    batches = []
    for part in torch.split(nodes[order], _CALIBRATION_SEEDS)[:_CALIBRATION_BATCHES]:
        sub = sampler.sample(part.sort().values)
        batches.append((features[sub.n_id], list(sub.blocks)))  # [N_s, F_kept], blocks
    return batches


def _evaluate(
    model: GNN, store: GraphStore, keep: Sequence[int], fanouts: Sequence[int], seed: int
) -> tuple[float, float]:
    """(val, test) metric of ``model`` through the serving path with ``fanouts``."""
    import torch

    from gnnaas.variants.training import evaluate

    keep_t = torch.as_tensor(list(keep), dtype=torch.int64)
    full = keep_t.numel() == store.num_features
    kwargs: dict[str, Any] = {"keep": None if full else keep_t, "fanouts": tuple(fanouts)}
    val = evaluate(model, store, store.val_idx, seed=seed, **kwargs)
    test = (
        evaluate(model, store, store.test_idx, seed=seed, **kwargs)
        if store.test_idx.numel()
        else float("nan")
    )
    return val, test


def _manifest_of(
    root: Manifest,
    spec: VariantSpec,
    *,
    base: Manifest,
    hidden: int,
    fanouts: Sequence[int],
    metrics: dict[str, float],
    origin: str,
) -> Manifest:
    from gnnaas.variants.manifest import library_versions

    return replace(
        root,
        variant_id=spec.variant_id,
        hidden_channels=hidden,
        fanouts=[int(f) for f in fanouts],
        metrics=metrics,
        versions=library_versions(),
        weights_sha256="",
        created=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        origin=origin,
        precomputed=None,
        axes={
            "fanouts": None if spec.fanouts is None else list(spec.fanouts),
            "hidden": spec.hidden,
            "precision": spec.precision,
        },
        base={"variant": base.variant_id, "weights_sha256": base.weights_sha256},
        train_fanouts=base.trained_fanouts,
    )


def _current(repo: VariantRepository, spec: VariantSpec, base: Manifest) -> Manifest | None:
    """The stored variant ``spec`` when it is intact and derives from ``base`` as it is now."""
    try:
        manifest = repo.verify(spec.dataset, spec.variant_id)
    except ArtifactError:
        return None
    same_base = manifest.base is not None and manifest.base == {
        "variant": base.variant_id,
        "weights_sha256": base.weights_sha256,
    }
    return manifest if same_base and manifest.spec == spec else None


def derive_variants(
    store: GraphStore,
    repo: VariantRepository,
    config: TrainConfig,
    *,
    archs: Sequence[str],
    axes: Sequence[str] = DEFAULT_AXES,
    near: float = DEFAULT_NEAR,
    width_divisors: Sequence[int] = DEFAULT_WIDTH_DIVISORS,
    fanout_sets: Sequence[Sequence[int]] | None = None,
    sampler_seed: int = 0,
    device: Any = "cpu",
    force: bool = False,
    on_variant: Callable[[str], None] | None = None,
    on_epoch: Callable[[EpochReport], None] | None = None,
) -> list[DerivedRow]:
    """Derives width, fanout and int8 variants from the stored trained variants of ``archs``.

    Roots: per architecture, the trained variants within ``near`` validation points of the most
    accurate trained variant of the dataset (at most two, most accurate first; at least that
    architecture's best). Then, per architecture:

    1. ``width``: the architecture's most accurate trained variant teaches narrower models
       (its hidden width divided by each of ``width_divisors``) on its kept features;
    2. ``fanouts``: every root and width variant gets the smaller fanouts that bind on this graph
       (:func:`binding_fanouts`), or ``fanout_sets`` when given;
    3. ``precision``: every variant of the architecture computed so far (trained and derived)
       gets an int8 twin when int8 is measured faster on its forward (:func:`int8_speedup`),
       measured once per base weights and fanouts and recorded
       (:mod:`gnnaas.variants.decisions`).

    A derived variant already stored from the same base weights is kept unless ``force``; so is
    a recorded int8 decision (``force`` measures again).

    Args:
        store (GraphStore): the dataset.
        repo (VariantRepository): where the trained variants are and the derived ones go.
        config (TrainConfig): the dataset's training configuration (distillation uses it with
            the narrower width).
        archs (Sequence[str]): architectures to derive for.
        axes (Sequence[str], optional): among :data:`AXES`. (default: every axis)
        near (float, optional): root window in points. (default: :data:`DEFAULT_NEAR`)
        width_divisors (Sequence[int], optional): distilled widths are ``hidden // d``.
            (default: ``(2, 4)``)
        fanout_sets (Sequence[Sequence[int]], optional): serving fanouts to derive instead of
            the automatic choice. (default: ``None``)
        sampler_seed (int, optional): the serving sampler's seed. (default: ``0``)
        device (str | torch.device, optional): where distillation trains. (default: ``cpu``)
        force (bool, optional): derive again what exists. (default: ``False``)
        on_variant (Callable[[str], None], optional): called with each variant id as its work
            starts (progress). (default: ``None``)
        on_epoch (Callable[[EpochReport], None], optional): called as each epoch of a
            distillation finishes (progress; see :func:`~gnnaas.variants.training.train_model`).
            (default: ``None``)

    Returns:
        list[DerivedRow]: one row per derived variant, in order of derivation.
    """
    wanted = set(axes)
    trained = _trained(store, repo, archs)
    if not trained or not wanted & {"width", "fanouts", "precision"}:
        return []
    best = max(_val_acc(m) for m in trained)
    rows: list[DerivedRow] = []
    for arch in archs:
        mine, bases = _ranked_and_roots(trained, arch, best, near)
        if not mine:
            continue
        rows += _derive_arch(
            store, repo, config, mine, bases, wanted,
            width_divisors, fanout_sets, sampler_seed, device, force, on_variant, on_epoch,
        )  # fmt: skip
    return rows


def _derive_arch(
    store: GraphStore,
    repo: VariantRepository,
    config: TrainConfig,
    mine: list[Manifest],
    bases: list[Manifest],
    wanted: set[str],
    width_divisors: Sequence[int],
    fanout_sets: Sequence[Sequence[int]] | None,
    sampler_seed: int,
    device: Any,
    force: bool,
    on_variant: Callable[[str], None] | None,
    on_epoch: Callable[[EpochReport], None] | None,
) -> list[DerivedRow]:
    """One architecture's derived variants (``mine``: its trained ones, most accurate first;
    ``bases``: its roots): the widths its best distils, the smaller fanouts of the roots and the
    widths, then the int8 twins of all of them, in that order (:func:`derive_variants`)."""
    derived: list[tuple[Manifest, DerivedRow]] = []
    if "width" in wanted:
        derived += _width_variants(
            store, repo, config, mine[0], width_divisors, device, force, on_variant, on_epoch
        )
        bases = bases + [manifest for manifest, _ in derived]
    if "fanouts" in wanted:
        derived += _fanout_variants(
            store, repo, bases, fanout_sets, sampler_seed, force, on_variant
        )
    rows = [row for _, row in derived]
    if "precision" in wanted:
        computed = mine + [manifest for manifest, _ in derived]
        rows += _int8_twins(store, repo, computed, sampler_seed, force, on_variant)
    return rows


def _ranked_and_roots(
    trained: Sequence[Manifest], arch: str, best: float, near: float
) -> tuple[list[Manifest], list[Manifest]]:
    """``arch``'s trained variants, most accurate first, and its roots: those within ``near``
    points of the dataset's ``best`` (at most :data:`_MAX_ROOTS_PER_ARCH`; at least its best)."""
    mine = sorted(
        (m for m in trained if m.arch == arch), key=lambda m: (-_val_acc(m), m.variant_id)
    )
    roots = [m for m in mine if _val_acc(m) >= best - near / 100.0]
    return mine, (roots or mine[:1])[:_MAX_ROOTS_PER_ARCH]


def _val_acc(manifest: Manifest) -> float:
    """A stored variant's validation accuracy (0 when it has none)."""
    return float(manifest.metrics.get("val_acc", 0.0))


def _trained(store: GraphStore, repo: VariantRepository, archs: Sequence[str]) -> list[Manifest]:
    """The stored trained variants of ``archs`` (the roots and teachers of the other axes)."""
    wanted = set(archs)
    return [
        m
        for m in repo.list(store.name)
        if m.precomputed is None and not m.spec.derived and m.arch in wanted
    ]


def _width_variants(
    store: GraphStore,
    repo: VariantRepository,
    config: TrainConfig,
    teacher: Manifest,
    width_divisors: Sequence[int],
    device: Any,
    force: bool,
    on_variant: Callable[[str], None] | None,
    on_epoch: Callable[[EpochReport], None] | None,
) -> Iterator[tuple[Manifest, DerivedRow]]:
    """The narrower models ``teacher`` (an architecture's most accurate trained variant)
    distils on its kept features, one per width of :func:`distilled_widths`."""
    for hidden in distilled_widths(teacher.hidden_channels, width_divisors):
        yield _distill(store, repo, config, teacher, hidden, device, force, on_variant, on_epoch)


def _fanout_variants(
    store: GraphStore,
    repo: VariantRepository,
    bases: Sequence[Manifest],
    fanout_sets: Sequence[Sequence[int]] | None,
    sampler_seed: int,
    force: bool,
    on_variant: Callable[[str], None] | None,
) -> Iterator[tuple[Manifest, DerivedRow]]:
    """Each base's variants at smaller serving fanouts (its weights, other fanouts): the binding
    ones (:func:`binding_fanouts`), or ``fanout_sets`` when given."""
    for base in bases:
        sets = (
            [tuple(int(f) for f in s) for s in fanout_sets]
            if fanout_sets is not None
            else binding_fanouts(store, base.trained_fanouts, sampler_seed=sampler_seed)
        )
        for fanouts in sets:
            if len(fanouts) != base.num_layers:
                raise ConfigError(
                    f"fanouts {list(fanouts)} need one value per layer; "
                    f"{base.variant_id} has {base.num_layers} layers"
                )
            spec = base.spec.with_axes(fanouts=fanouts)
            yield _same_weights(store, repo, base, spec, sampler_seed, force, on_variant)


def distilled_widths(hidden: int, divisors: Sequence[int]) -> list[int]:
    """The hidden widths distilled from a teacher ``hidden`` wide: ``hidden // d`` for each
    divisor ``d``, those of at least 4 units, each once.

    Args:
        hidden (int): the teacher's hidden width.
        divisors (Sequence[int]): integers >= 2.

    Returns:
        list[int]: the widths, in the order of ``divisors``.

    Raises:
        ConfigError: a divisor that is not an integer >= 2.

    Example:
        >>> distilled_widths(256, (2, 4, 128))
        [128, 64]
    """
    out = []
    for d in divisors:
        if isinstance(d, bool) or not isinstance(d, int) or d < 2:
            raise ConfigError(f"width divisors must be integers >= 2 (got {d!r})")
        if hidden // d >= 4 and hidden // d not in out:
            out.append(hidden // d)
    return out


def _distill(
    store: GraphStore,
    repo: VariantRepository,
    config: TrainConfig,
    teacher: Manifest,
    hidden: int,
    device: Any,
    force: bool,
    on_variant: Callable[[str], None] | None,
    on_epoch: Callable[[EpochReport], None] | None = None,
) -> tuple[Manifest, DerivedRow]:
    import torch

    from gnnaas.variants.training import train_model

    spec = teacher.spec.with_axes(hidden=hidden)
    if on_variant is not None:
        on_variant(spec.variant_id)
    existing = None if force else _current(repo, spec, teacher)
    if existing is not None:
        return existing, _row(existing, teacher, 0.0, "skipped")
    start = time.perf_counter()
    teacher_model = repo.load(store.name, teacher.variant_id).model
    keep = torch.as_tensor(teacher.kept_features, dtype=torch.int64)
    full = keep.numel() == store.num_features
    arch_config = replace(
        config,
        hidden_channels=hidden,
        family=teacher.family,
        num_layers=teacher.num_layers,
        fanouts=tuple(teacher.trained_fanouts),
    )
    result = train_model(
        store,
        teacher.arch,
        arch_config,
        keep=None if full else keep,
        device=device,
        teacher=teacher_model,
        on_epoch=on_epoch,
    )
    metrics = {
        "val_acc": float(result.val_acc),
        "test_acc": float(result.test_acc),
        "train_time_s": float(result.train_time_s),
        "epochs": int(result.epochs),
    }
    manifest = _manifest_of(
        teacher,
        spec,
        base=teacher,
        hidden=hidden,
        fanouts=teacher.fanouts,
        metrics=metrics,
        origin="trained",
    )
    manifest = repo.save(manifest, result.model)
    _log.info(
        "variant: %s teacher: %s val_acc: %.4f train_time_s: %.2f",
        spec.variant_id,
        teacher.variant_id,
        result.val_acc,
        result.train_time_s,
    )
    return manifest, _row(manifest, teacher, time.perf_counter() - start, "distilled")


def _same_weights(
    store: GraphStore,
    repo: VariantRepository,
    base: Manifest,
    spec: VariantSpec,
    sampler_seed: int,
    force: bool,
    on_variant: Callable[[str], None] | None,
) -> tuple[Manifest, DerivedRow]:
    """A variant serving ``base``'s weights with ``spec``'s fanouts and precision."""
    if on_variant is not None:
        on_variant(spec.variant_id)
    existing = None if force else _current(repo, spec, base)
    if existing is not None:
        return existing, _row(existing, base, 0.0, "skipped")
    start = time.perf_counter()
    model = repo.load(store.name, base.variant_id).model
    fanouts = list(spec.fanouts) if spec.fanouts is not None else base.fanouts
    served, ranges = model, None
    if spec.precision == "int8":
        from gnnaas.models.quantize import calibrate_int8, quantize_int8

        ranges = calibrate_int8(
            model, _calibration_batches(store, base.kept_features, fanouts, sampler_seed)
        )
        served = quantize_int8(model, ranges)
    val, test = _evaluate(served, store, base.kept_features, fanouts, sampler_seed)
    metrics = {"val_acc": float(val), "test_acc": float(test)}
    manifest = _manifest_of(
        base,
        spec,
        base=base,
        hidden=base.hidden_channels,
        fanouts=fanouts,
        metrics=metrics,
        origin=base.origin,
    )
    manifest = replace(manifest, int8_ranges=ranges)
    manifest = repo.save(manifest, model)  # the base's fp32 weights, byte for byte
    _log.info("variant: %s base: %s val_acc: %.4f", spec.variant_id, base.variant_id, val)
    return manifest, _row(manifest, base, time.perf_counter() - start, "derived")


def _int8_twins(
    store: GraphStore,
    repo: VariantRepository,
    computed: Sequence[Manifest],
    sampler_seed: int,
    force: bool,
    on_variant: Callable[[str], None] | None,
) -> list[DerivedRow]:
    from gnnaas.models.quantize import int8_available
    from gnnaas.variants.decisions import Int8Decisions

    if not int8_available():
        _log.warning("int8 variants skipped: this torch build or CPU has no dynamic int8 linear")
        return []
    decisions = Int8Decisions.load(repo, store.name)
    rows: list[DerivedRow] = []
    for base in computed:
        spec = base.spec.with_axes(precision="int8")
        existing = None if force else _current(repo, spec, base)
        if existing is not None:
            rows.append(_row(existing, base, 0.0, "skipped"))
            continue
        if not _int8_wins(store, repo, base, decisions, force):
            continue
        manifest, row = _same_weights(store, repo, base, spec, sampler_seed, force, on_variant)
        rows.append(row)
    return rows


def _int8_wins(
    store: GraphStore,
    repo: VariantRepository,
    base: Manifest,
    decisions: Int8Decisions,
    force: bool,
) -> bool:
    """Whether ``base`` gets an int8 twin: the decision recorded on its current weights and
    fanouts (:mod:`gnnaas.variants.decisions`), else (or with ``force``) :func:`int8_speedup`
    measured now and recorded, so that a second run makes the same set without timing again."""
    decision = None if force else decisions.get(base)
    if decision is None:
        model = repo.load(store.name, base.variant_id).model
        speedup = int8_speedup(model, store, base.kept_features, base.fanouts)
        decision = decisions.record(base, speedup, _INT8_MIN_SPEEDUP)
    if not decision.kept:
        _log.info(
            "int8 of %s not generated: %.2fx the fp32 forward's speed here (needs %.2fx; "
            "measured %s, recorded in %s)",
            base.variant_id,
            decision.speedup,
            decision.min_speedup,
            decision.measured,
            decisions.path,
        )
    return decision.kept


def _row(manifest: Manifest, base: Manifest, seconds: float, status: str) -> DerivedRow:
    return DerivedRow(
        variant_id=manifest.variant_id,
        base=base.variant_id,
        features_kept=manifest.in_channels,
        val_acc=float(manifest.metrics.get("val_acc", float("nan"))),
        seconds=seconds,
        status=status,
    )
