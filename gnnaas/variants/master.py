"""A user's master model: a PyG ``GraphSAGE`` or ``GIN`` trained elsewhere, as the 1× variant.

``gnnaas generate --from-model W.safetensors --model-config C.json`` reads the state dict of
``torch_geometric.nn.models.GraphSAGE`` or ``GIN`` (the classes a PyG user trains) and a JSON
config naming the class and its sizes, checks that it fits the dataset, evaluates it through the
serving execution path, and stores it as ``<arch>-full-1x`` (family ``pyg``, origin ``user``).
The pruned variants are then ranked from *that* model and trained in the same layout
(:func:`gnnaas.variants.pipeline.generate_variants`), optionally warm-started from its weights
restricted to the kept features (:func:`warm_start_state`).

The config (JSON object)::

    {"class": "GraphSAGE", "in_channels": 1433, "hidden_channels": 64,
     "num_layers": 2, "out_channels": 7, "dropout": 0.5}

``dropout`` is optional (PyG's default 0.0; it does not change inference). PyG options that change
the layout (``norm``, ``jk``, ``act`` other than ``relu``, a SAGE ``aggr`` other than ``mean``)
may be given only with their default values; anything else is refused with the reason.

Never unpickles: the weights are read with :func:`safetensors.torch.load`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from gnnaas.errors import ConfigError
from gnnaas.models import Arch, build_model
from gnnaas.models.pyg import PYG_CLASSES
from gnnaas.typing import PathType
from gnnaas.variants.manifest import (
    FULL_RANKING,
    MANIFEST_FORMAT,
    USER_RANKING,
    Manifest,
    VariantSpec,
    library_versions,
)

if TYPE_CHECKING:
    from gnnaas.data import GraphStore
    from gnnaas.models import GNN
    from gnnaas.variants.repository import VariantRepository

__all__ = [
    "MasterConfig",
    "add_user_variant",
    "check_state_dict",
    "import_master",
    "read_kept_features",
    "read_model_config",
    "read_state_dict",
    "warm_start_state",
]

_ARCH_OF: dict[str, Arch] = {name: cls.arch for name, cls in PYG_CLASSES.items()}
_SIZES = ("in_channels", "hidden_channels", "num_layers", "out_channels")
# PyG options the layout supports only with these values (None: the key may be absent or null).
_DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    "norm": (None,),
    "jk": (None, "last"),
    "act": ("relu", None),
    "act_first": (False,),
    "aggr": ("mean",),
    "train_eps": (False,),
}


@dataclass(frozen=True)
class MasterConfig:
    """What ``--model-config`` says about the user's model.

    Args:
        model_class (str): ``GraphSAGE`` or ``GIN`` (PyG's class name).
        in_channels (int): input features (the dataset's feature count).
        hidden_channels (int): width of the hidden layers.
        num_layers (int): message-passing layers (= hops).
        out_channels (int): classes.
        dropout (float, optional): dropout between layers (training only). (default: ``0.0``)
    """

    model_class: str
    in_channels: int
    hidden_channels: int
    num_layers: int
    out_channels: int
    dropout: float = 0.0

    @property
    def arch(self) -> Arch:
        """The gnnaas architecture of the class (``sage`` or ``gin``)."""
        return _ARCH_OF[self.model_class]

    def build(self) -> GNN:
        """An untrained model with the class's layout (:mod:`gnnaas.models.pyg`)."""
        return build_model(
            self.arch,
            self.in_channels,
            self.hidden_channels,
            self.out_channels,
            num_layers=self.num_layers,
            dropout=self.dropout,
            family="pyg",
        )


def read_model_config(path: PathType) -> MasterConfig:
    """Reads and checks a ``--model-config`` JSON file.

    Raises:
        ConfigError: unreadable file, not a JSON object, an unknown class, a missing or
            non-integer size, an unsupported option; the message names the key.
    """
    source = f"model config {str(path)!r}"
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{source} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source} cannot be read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source} is not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source} must be a JSON object (got {type(data).__name__})")
    cls = data.get("class")
    if cls not in _ARCH_OF:
        raise ConfigError(f"{source}: 'class' must be one of {', '.join(_ARCH_OF)} (got {cls!r})")
    sizes = {}
    for key in _SIZES:
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{source}: {key!r} must be an integer >= 1 (got {value!r})")
        sizes[key] = value
    dropout = data.get("dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0 <= dropout < 1:
        raise ConfigError(f"{source}: 'dropout' must be a number in [0, 1) (got {dropout!r})")
    for key, allowed in _DEFAULT_ONLY.items():
        if key in data and data[key] not in allowed:
            raise ConfigError(
                f"{source}: {key}={data[key]!r} is not supported (gnnaas serves the layout of "
                f"{cls} with {key}={allowed[0]!r})"
            )
    unknown = sorted(set(data) - {"class", "dropout", *_SIZES, *_DEFAULT_ONLY})
    if unknown:
        raise ConfigError(
            f"{source}: unknown keys {unknown}; expected class, "
            + ", ".join(_SIZES)
            + " and optionally dropout"
        )
    return MasterConfig(cls, dropout=float(dropout), **sizes)


def read_state_dict(path: PathType) -> dict[str, Tensor]:
    """Reads a state dict from a safetensors file (never a pickle).

    Raises:
        ConfigError: a missing file, or one that is not safetensors (e.g. a ``torch.save``
            pickle: the message says how to convert it).
    """
    from safetensors import SafetensorError
    from safetensors.torch import load

    source = f"weights {str(path)!r}"
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{source} do not exist") from None
    except OSError as exc:
        raise ConfigError(f"{source} cannot be read ({exc})") from None
    try:
        return load(data)
    except (SafetensorError, ValueError) as exc:
        raise ConfigError(
            f"{source} are not a safetensors file ({exc}); save them with "
            "safetensors.torch.save_file(model.state_dict(), PATH)"
        ) from None


def check_state_dict(model: torch.nn.Module, state: Mapping[str, Tensor], source: str) -> None:
    """Checks that ``state`` has exactly ``model``'s keys with its shapes.

    Raises:
        ConfigError: naming the first missing key, unexpected key or wrong shape.
    """
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    if missing:
        raise ConfigError(
            f"{source} lack {len(missing)} key(s) the config's model has, first {missing[0]!r} "
            f"(shape {list(expected[missing[0]].shape)}); is the config's class or num_layers "
            "right?"
        )
    unexpected = [k for k in state if k not in expected]
    if unexpected:
        raise ConfigError(
            f"{source} have {len(unexpected)} key(s) the config's model does not, first "
            f"{unexpected[0]!r}; is the config's class or num_layers right?"
        )
    for key, want in expected.items():
        got = state[key]
        if tuple(got.shape) != tuple(want.shape):
            raise ConfigError(
                f"{source}: {key!r} has shape {list(got.shape)}, the config's model expects "
                f"{list(want.shape)}; check in_channels, hidden_channels and out_channels"
            )
        if got.is_floating_point() and not bool(torch.isfinite(got).all()):
            raise ConfigError(f"{source}: {key!r} holds NaN or inf values")


def import_master(
    store: GraphStore,
    repo: VariantRepository,
    weights: PathType,
    model_config: PathType,
    *,
    fanouts: tuple[int, ...] | None = None,
    seed: int = 0,
    batch_size: int = 1024,
    device: str = "cpu",
    force: bool = False,
) -> tuple[Manifest, GNN]:
    """Stores the user's model as ``<arch>-full-1x`` of ``store``, evaluated as it will be served.

    Args:
        store (GraphStore): the dataset the model was trained on.
        repo (VariantRepository): where to store it.
        weights (PathType): the state dict, safetensors.
        model_config (PathType): the JSON config (see the module docstring).
        fanouts (tuple[int, ...], optional): serving fanouts, one per layer.
            (default: ``None``: ``(25, 10)`` for 2 layers, ``(25,)`` for 1, ``(15, 10, 5)`` for 3)
        seed (int, optional): the serving sampler's seed. (default: ``0``)
        batch_size (int, optional): evaluation batch size. (default: ``1024``)
        device (str, optional): where to evaluate. (default: ``"cpu"``)
        force (bool, optional): replace an existing ``<arch>-full-1x``. (default: ``False``)

    Returns:
        tuple[Manifest, GNN]: the stored manifest and the model (CPU, eval mode).

    Raises:
        ConfigError: a bad config or weights file, a model that does not fit the dataset
            (input width, classes), fanouts that are not one per layer, or an existing 1x
            variant without ``force``.
    """
    config = read_model_config(model_config)
    source = f"weights {str(weights)!r}"
    # The weights against their config first (names the key and both shapes), then the pair
    # against the graph.
    state = read_state_dict(weights)
    model = config.build()
    check_state_dict(model, state, source)
    if config.in_channels != store.num_features:
        raise ConfigError(
            f"model config {str(model_config)!r}: in_channels={config.in_channels} (and the "
            f"weights agree), but dataset '{store.name}' has {store.num_features} features; a "
            "master model reads every feature"
        )
    if config.out_channels != store.num_classes:
        raise ConfigError(
            f"model config {str(model_config)!r}: out_channels={config.out_channels} (and the "
            f"weights agree), but dataset '{store.name}' has {store.num_classes} classes"
        )
    fanouts = _fanouts(fanouts, config.num_layers)
    spec = VariantSpec(store.name, config.arch.value, FULL_RANKING, 1)
    if not force and repo.path(store.name, spec.variant_id).exists():
        raise ConfigError(
            f"variant {spec.variant_id} of {store.name} exists; pass --force to replace it with "
            "your model (its pruned variants are then retrained and must be profiled again)"
        )
    model.load_state_dict(state, strict=True)
    model.eval()

    start = time.perf_counter()
    metrics = _served_metrics(model, store, fanouts, batch_size, device, seed)
    metrics["eval_time_s"] = time.perf_counter() - start
    model = model.cpu().eval()
    manifest = _master_manifest(store, spec, config, fanouts, metrics, seed)
    return repo.save(manifest, model), model


def _served_metrics(
    model: GNN, store: GraphStore, fanouts: Sequence[int], batch_size: int, device: str, seed: int
) -> dict[str, float]:
    """The master's validation and test accuracy through the served pipeline (NaN for an empty
    split), with no training behind them."""
    from gnnaas.variants.training import evaluate

    metrics: dict[str, float] = {}
    for split, nodes in (("val_acc", store.val_idx), ("test_acc", store.test_idx)):
        metrics[split] = (
            evaluate(
                model,
                store,
                nodes,
                fanouts=fanouts,
                batch_size=batch_size,
                device=device,
                seed=seed,
            )
            if nodes.numel()
            else math.nan
        )
    return {**metrics, "train_time_s": 0.0, "epochs": 0}


def _master_manifest(
    store: GraphStore,
    spec: VariantSpec,
    config: MasterConfig,
    fanouts: Sequence[int],
    metrics: dict[str, float],
    seed: int,
) -> Manifest:
    """The manifest of the user's model stored as ``spec`` (every feature kept; origin
    ``user``)."""
    return Manifest(
        format=MANIFEST_FORMAT,
        dataset=store.name,
        variant_id=spec.variant_id,
        arch=spec.arch,
        ranking=spec.ranking,
        prune=1,
        num_features=store.num_features,
        kept_features=list(range(store.num_features)),
        in_channels=config.in_channels,
        hidden_channels=config.hidden_channels,
        out_channels=config.out_channels,
        num_layers=config.num_layers,
        dropout=config.dropout,
        fanouts=[int(f) for f in fanouts],
        multi_label=store.multi_label,
        metrics=metrics,
        seed=seed,
        versions=library_versions(),
        family="pyg",
        origin="user",
    )


def warm_start_state(master: GNN, keep: Tensor) -> dict[str, Tensor]:
    """``master``'s weights for a model that reads only the ``keep`` features.

    The first-layer weights that multiply the raw features
    (:meth:`~gnnaas.models.GNN.first_layer_weights`) keep their ``keep`` columns; every other
    tensor is copied as is. Load the result into a model of the same layout with
    ``in_channels = len(keep)``.

    Example:
        >>> from gnnaas.models import build_model
        >>> master = build_model("sage", 8, 4, 2, family="pyg")
        >>> state = warm_start_state(master, torch.tensor([0, 3]))
        >>> tuple(state["convs.0.lin_l.weight"].shape)
        (4, 2)
    """
    first = {id(w) for w in master.first_layer_weights()}
    out = {}
    for name, tensor in master.state_dict(keep_vars=True).items():
        value = tensor.detach()
        out[name] = value[:, keep].clone() if id(tensor) in first else value.clone()
    return out


def read_kept_features(path: PathType, num_features: int) -> Tensor:
    """Reads ``--kept-features``: a JSON list or a ``.npy`` vector of feature column ids.

    Returns:
        Tensor: ``[k]`` int64 ids in the file's order (the model's input columns).

    Raises:
        ConfigError: unreadable, not a flat list of integers, ids outside ``[0, F)``, repeated
            ids, or none; the message names the first offender.
    """
    import numpy as np

    source = f"kept features {str(path)!r}"
    p = Path(path)
    try:
        if p.suffix.lower() == ".npy":
            values = np.load(p, allow_pickle=False)
        else:
            values = np.asarray(json.loads(p.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise ConfigError(f"{source} do not exist") from None
    except (OSError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise ConfigError(f"{source} cannot be read as a JSON list or .npy ({exc})") from None
    if values.ndim != 1 or values.size == 0 or values.dtype.kind not in "iu":
        raise ConfigError(
            f"{source} must be a non-empty flat list of integer column ids "
            f"(got shape {list(values.shape)}, dtype {values.dtype})"
        )
    ids = torch.from_numpy(values.astype(np.int64))
    bad = ((ids < 0) | (ids >= num_features)).nonzero().view(-1)
    if bad.numel():
        i = int(bad[0])
        raise ConfigError(f"{source}: [{i}] = {int(ids[i])} is outside [0, {num_features})")
    uniq, counts = torch.unique(ids, return_counts=True)
    if bool((counts > 1).any()):
        raise ConfigError(f"{source}: column {int(uniq[counts > 1][0])} is listed twice")
    return ids


def add_user_variant(
    store: GraphStore,
    repo: VariantRepository,
    weights: PathType,
    model_config: PathType,
    kept_features: PathType,
    *,
    fanouts: tuple[int, ...] | None = None,
    seed: int = 0,
    batch_size: int = 1024,
    device: str = "cpu",
    force: bool = False,
) -> Manifest:
    """Adds a pruned variant the user trained: ``<arch>-user-<k>x`` with ``k = round(F / kept)``.

    The model (PyG ``GraphSAGE``/``GIN``, as for :func:`import_master`) reads the ``kept``
    columns in the file's order; they are stored ascending, with the first-layer weight columns
    permuted to match, so the variant runs like every other. It is evaluated on the serving path
    and written atomically; profile it with ``gnnaas profile --only <id>``.

    Raises:
        ConfigError: a bad file, a model that does not fit (``in_channels`` must equal the
            number of kept features), every feature kept (that is a master model:
            ``generate --from-model``), or an existing id without ``force``.
    """
    from gnnaas.variants.training import evaluate

    config, model, state, keep = _user_model(store, weights, model_config, kept_features)
    fanouts = _fanouts(fanouts, config.num_layers)
    prune = max(2, round(store.num_features / keep.numel()))
    spec = VariantSpec(store.name, config.arch.value, USER_RANKING, prune)
    if not force and repo.path(store.name, spec.variant_id).exists():
        raise ConfigError(
            f"variant {spec.variant_id} of {store.name} exists; pass --force to replace it"
        )
    model.load_state_dict(state, strict=True)
    order = torch.argsort(keep)
    keep = keep[order]
    with torch.no_grad():
        for w in model.first_layer_weights():
            w.copy_(w[:, order])
    model.eval()
    metrics = {
        name: evaluate(
            model, store, nodes, keep=keep, fanouts=fanouts, batch_size=batch_size,
            device=device, seed=seed,
        )
        if nodes.numel()
        else math.nan
        for name, nodes in (("val_acc", store.val_idx), ("test_acc", store.test_idx))
    }  # fmt: skip
    manifest = Manifest(
        format=MANIFEST_FORMAT,
        dataset=store.name,
        variant_id=spec.variant_id,
        arch=spec.arch,
        ranking=spec.ranking,
        prune=prune,
        num_features=store.num_features,
        kept_features=[int(i) for i in keep.tolist()],
        in_channels=config.in_channels,
        hidden_channels=config.hidden_channels,
        out_channels=config.out_channels,
        num_layers=config.num_layers,
        dropout=config.dropout,
        fanouts=list(fanouts),
        multi_label=store.multi_label,
        metrics={**metrics, "train_time_s": 0.0, "epochs": 0},
        seed=seed,
        versions=library_versions(),
        family="pyg",
        origin="user",
    )
    return repo.save(manifest, model.cpu())


def _user_model(
    store: GraphStore, weights: PathType, model_config: PathType, kept_features: PathType
) -> tuple[MasterConfig, GNN, dict[str, Tensor], Tensor]:
    """The user's pruned model as its files give it, checked against ``store``: its config,
    the model built from it (weights not loaded yet), the weights, and the kept columns in the
    file's order.

    Raises:
        ConfigError: a bad file, every feature kept, or a model whose input or output does not
            fit the kept columns or the dataset's classes.
    """
    config = read_model_config(model_config)
    keep = read_kept_features(kept_features, store.num_features)
    if keep.numel() == store.num_features:
        raise ConfigError(
            "the variant keeps every feature: that is a master model; use "
            "`gnnaas generate --from-model` for it"
        )
    state = read_state_dict(weights)
    model = config.build()
    check_state_dict(model, state, f"weights {str(weights)!r}")
    if config.in_channels != keep.numel():
        raise ConfigError(
            f"model config {str(model_config)!r}: in_channels={config.in_channels} (and the "
            f"weights agree), but --kept-features lists {keep.numel()} columns; the model must "
            "read exactly the kept columns"
        )
    if config.out_channels != store.num_classes:
        raise ConfigError(
            f"model config {str(model_config)!r}: out_channels={config.out_channels} (and the "
            f"weights agree), but dataset '{store.name}' has {store.num_classes} classes"
        )
    return config, model, state, keep


_DEFAULT_FANOUTS = {1: (25,), 2: (25, 10), 3: (15, 10, 5)}


def _fanouts(fanouts: tuple[int, ...] | None, num_layers: int) -> tuple[int, ...]:
    if fanouts is None:
        if num_layers not in _DEFAULT_FANOUTS:
            raise ConfigError(
                f"no default fanouts for a {num_layers}-layer model; give one per layer"
            )
        return _DEFAULT_FANOUTS[num_layers]
    if len(fanouts) != num_layers:
        raise ConfigError(
            f"the model has {num_layers} layers but {len(fanouts)} fanouts were given "
            f"({list(fanouts)}); pass one fanout per layer"
        )
    return tuple(int(f) for f in fanouts)
