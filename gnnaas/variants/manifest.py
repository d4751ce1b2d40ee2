"""What a variant is and what its ``manifest.json`` says: :class:`VariantSpec`, :class:`Manifest`.

:class:`VariantSpec` names a variant (dataset, architecture, ranking, prune factor and the serving
axes) and makes its id; :class:`Manifest` is the text file stored beside a variant's weights, with
everything needed to rebuild the model (docs/internals.md, "variants"), parsed and checked by
:meth:`Manifest.from_dict`. Kept apart from the repository's file operations
(:mod:`gnnaas.variants.repository`: atomic saves, checksums, loading), so that the format and its
validation read in one place and whatever only names or describes variants needs no file code.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

import torch

from gnnaas.errors import ArtifactError, ConfigError
from gnnaas.models.quantize import PRECISIONS
from gnnaas.variants.ranking import Ranking

if TYPE_CHECKING:
    from gnnaas.variants.training import TrainConfig

__all__ = [
    "EXACT_SUFFIX",
    "FULL_RANKING",
    "MANIFEST_FORMAT",
    "USER_RANKING",
    "Manifest",
    "VariantSpec",
    "library_versions",
]

MANIFEST_FORMAT = 1
"""Version of the manifest layout written by this code."""
# Keys added after format 1 was written: a manifest without them has their default.
_OPTIONAL_KEYS = (
    "family",
    "origin",
    "precomputed",
    "axes",
    "base",
    "train_fanouts",
    "int8_ranges",
)
_ORIGINS = ("trained", "user")

FULL_RANKING = "full"
"""The ranking name of the 1× model, shared by every ranking (variant id ``<arch>-full-1x``)."""
USER_RANKING = "user"
"""The ranking of a pruned variant the user trained on features they chose (``variants add``)."""

EXACT_SUFFIX = "@exact"
"""Suffix of a precomputed variant's id: ``<base-id>@exact`` (``gnnaas precompute``)."""


def _parse_arch(arch: object) -> str:
    from gnnaas.models import Arch

    return Arch.parse(str(getattr(arch, "value", arch))).value


@dataclass(frozen=True)
class VariantSpec:
    """What a variant is: dataset, architecture, ranking, prune factor ``k`` and the serving axes.

    ``k = 1`` is the full-feature model shared by every ranking, so its ranking is normalized to
    ``"full"`` (``VariantSpec("Cora", "sage", "lasso", 1).ranking == "full"``). The axes beyond
    the kept features are optional and each adds a suffix to the id: ``fanouts`` (the same
    weights sampled with other fanouts, ``-f10.5``), ``hidden`` (a narrower model distilled from
    the variant's trained weights, ``-h128``) and ``precision`` (``int8``: its linear layers
    quantized, ``-int8``); unset, the variant is served as trained.

    Args:
        dataset (str): dataset name as the store names it (e.g. ``"Cora"``).
        arch (str): ``sage`` or ``gin`` (any case, or an ``Arch``).
        ranking (str): ``random``, ``greedy`` or ``lasso`` (or ``full`` when ``prune == 1``;
            ``user`` for a variant the user trained on features they chose).
        prune (int): prune factor ``k >= 1``; the variant keeps ``num_features // k`` features.
        fanouts (tuple[int, ...], optional): serving fanouts, PyG order, when they differ from
            the training fanouts. (default: ``None``)
        hidden (int, optional): hidden width of a distilled narrower model. (default: ``None``)
        precision (str, optional): one of :data:`PRECISIONS`. (default: ``"fp32"``)

    Example:
        >>> VariantSpec("Cora", "sage", "lasso", 4).variant_id
        'sage-lasso-4x'
        >>> VariantSpec("Cora", "gin", "full", 1, fanouts=(10, 5), hidden=64, precision="int8")
        ... .variant_id
        'gin-full-1x-f10.5-h64-int8'
    """

    dataset: str
    arch: str
    ranking: str
    prune: int
    fanouts: tuple[int, ...] | None = None
    hidden: int | None = None
    precision: str = "fp32"

    def __post_init__(self) -> None:
        if isinstance(self.prune, bool) or not isinstance(self.prune, int) or self.prune < 1:
            raise ConfigError(f"prune factor must be an integer >= 1 (got {self.prune!r})")
        object.__setattr__(self, "arch", _parse_arch(self.arch))
        ranking = str(getattr(self.ranking, "value", self.ranking)).strip().lower()
        if self.prune == 1:
            ranking = FULL_RANKING
        elif ranking == USER_RANKING:
            pass
        elif ranking == FULL_RANKING:
            raise ConfigError(
                f"ranking 'full' is only the 1x model; a {self.prune}x variant needs one of: "
                + ", ".join(r.value for r in Ranking)
            )
        else:
            ranking = Ranking.parse(ranking).value
        object.__setattr__(self, "ranking", ranking)
        if self.fanouts is not None:
            fanouts = tuple(int(f) for f in self.fanouts)
            if not fanouts or any(f < 1 for f in fanouts):
                raise ConfigError(f"variant fanouts must be integers >= 1 (got {self.fanouts!r})")
            object.__setattr__(self, "fanouts", fanouts)
        if self.hidden is not None and (
            isinstance(self.hidden, bool) or not isinstance(self.hidden, int) or self.hidden < 1
        ):
            raise ConfigError(f"variant hidden width must be an integer >= 1 (got {self.hidden!r})")
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"variant precision must be one of {', '.join(PRECISIONS)} (got {self.precision!r})"
            )

    @property
    def base_id(self) -> str:
        """``<arch>-<ranking>-<k>x``: the id without the serving axes."""
        return f"{self.arch}-{self.ranking}-{self.prune}x"

    @property
    def variant_id(self) -> str:
        """``<arch>-<ranking>-<k>x[-f<fanouts>][-h<hidden>][-int8]``; ``<arch>-full-1x`` for the
        1× model."""
        out = self.base_id
        if self.fanouts is not None:
            out += "-f" + ".".join(str(f) for f in self.fanouts)
        if self.hidden is not None:
            out += f"-h{self.hidden}"
        if self.precision != "fp32":
            out += f"-{self.precision}"
        return out

    @property
    def derived(self) -> bool:
        """Whether any serving axis is set (the variant derives from another one)."""
        return self.fanouts is not None or self.hidden is not None or self.precision != "fp32"

    def with_axes(
        self,
        *,
        fanouts: Sequence[int] | None = None,
        hidden: int | None = None,
        precision: str | None = None,
    ) -> VariantSpec:
        """This spec with the given axes set (the others kept)."""
        return replace(
            self,
            fanouts=self.fanouts if fanouts is None else tuple(fanouts),
            hidden=self.hidden if hidden is None else hidden,
            precision=self.precision if precision is None else precision,
        )


@dataclass
class Manifest:
    """The ``manifest.json`` of a variant; field names and order are the file's keys.

    ``weights_sha256`` is empty until
    :meth:`~gnnaas.variants.repository.VariantRepository.save` fills it in.
    ``kept_features`` are ascending column ids of the dataset's feature matrix. ``family`` is
    the layer layout (:func:`gnnaas.models.build_model`: ``gnnaas``, or ``pyg`` for variants of
    a user's PyG model) and ``origin`` says who trained the weights (``trained`` by gnnaas, or
    ``user``: a master model or variant the user brought); manifests written before these keys
    existed read as ``gnnaas`` and ``trained``.

    ``precomputed`` is set on a *precomputed* variant (``<base-id>@exact``, written by
    ``gnnaas precompute``): the base variant's model and weights plus ``answers.safetensors``,
    every node's exact prediction (full neighborhoods, ``fanouts`` all ``-1``) and embedding. Its
    keys: ``base`` (the base variant's id), ``graph_version``, ``num_nodes``, ``num_edges`` (of
    the graph the answers were computed on), ``embedding_dim``, ``answers_sha256``,
    ``seconds`` (the exact pass).

    A variant with serving axes (:class:`VariantSpec`) records them in ``axes`` (``fanouts``,
    ``hidden``, ``precision``; ``None``/``"fp32"`` when unset) and the variant it derives from in
    ``base``: ``{"variant": id, "weights_sha256": ...}`` of the variant whose weights it serves
    (other fanouts, int8) or that taught it (a distilled width), so a retrained base makes it
    stale. ``train_fanouts`` are the fanouts its weights were trained with (``None``: its
    ``fanouts``); a GIN's sums over more neighbors than that are scaled down to them
    (:attr:`gnnaas.models.GNN.train_fanouts`). An ``int8`` variant stores its fp32 weights and
    ``int8_ranges``, each linear layer's calibrated input range
    (:func:`gnnaas.models.calibrate_int8`), and is quantized with them when loaded.
    """

    format: int
    dataset: str
    variant_id: str
    arch: str
    ranking: str
    prune: int
    num_features: int
    kept_features: list[int]
    in_channels: int
    hidden_channels: int
    out_channels: int
    num_layers: int
    dropout: float
    fanouts: list[int]
    multi_label: bool
    metrics: dict[str, float]
    seed: int
    versions: dict[str, str] = field(default_factory=lambda: library_versions())
    weights_sha256: str = ""
    created: str = field(default_factory=lambda: _utc_now())
    family: str = "gnnaas"
    origin: str = "trained"
    precomputed: dict[str, Any] | None = None
    axes: dict[str, Any] = field(default_factory=lambda: dict(_NO_AXES))
    base: dict[str, str] | None = None
    train_fanouts: list[int] | None = None
    int8_ranges: dict[str, list[float]] | None = None

    @property
    def spec(self) -> VariantSpec:
        """The :class:`VariantSpec` this manifest describes."""
        fanouts = self.axes.get("fanouts")
        return VariantSpec(
            self.dataset,
            self.arch,
            self.ranking,
            self.prune,
            fanouts=None if fanouts is None else tuple(fanouts),
            hidden=self.axes.get("hidden"),
            precision=str(self.axes.get("precision", "fp32")),
        )

    @property
    def precision(self) -> str:
        """``fp32`` or ``int8`` (:data:`PRECISIONS`)."""
        return str(self.axes.get("precision", "fp32"))

    @property
    def trained_fanouts(self) -> list[int]:
        """The fanouts the weights were trained with."""
        return list(self.fanouts if self.train_fanouts is None else self.train_fanouts)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of the manifest (keys in the documented order; ``precomputed``,
        ``axes``, ``base`` and ``train_fanouts`` only where they say something)."""
        data = asdict(self)
        for key in ("precomputed", "base", "train_fanouts", "int8_ranges"):
            if data[key] is None:
                del data[key]
        if data["axes"] == _NO_AXES:
            del data["axes"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "manifest") -> Manifest:
        """Parses and checks a manifest object.

        Args:
            data (Mapping[str, Any]): the decoded ``manifest.json``.
            source (str, optional): where it came from, for error messages. (default: ``manifest``)

        Raises:
            ArtifactError: a key is missing, or a value has the wrong type or is inconsistent.
        """
        names = [f.name for f in fields(cls) if f.name not in _OPTIONAL_KEYS]
        missing = [n for n in names if n not in data]
        if missing:
            raise ArtifactError(f"{source} lacks keys {missing}; regenerate the variant")
        try:
            manifest = cls(
                format=int(data["format"]),
                dataset=str(data["dataset"]),
                variant_id=str(data["variant_id"]),
                arch=str(data["arch"]),
                ranking=str(data["ranking"]),
                prune=int(data["prune"]),
                num_features=int(data["num_features"]),
                kept_features=[int(i) for i in data["kept_features"]],
                in_channels=int(data["in_channels"]),
                hidden_channels=int(data["hidden_channels"]),
                out_channels=int(data["out_channels"]),
                num_layers=int(data["num_layers"]),
                dropout=float(data["dropout"]),
                fanouts=[int(s) for s in data["fanouts"]],
                multi_label=bool(data["multi_label"]),
                metrics={str(k): _number(v) for k, v in dict(data["metrics"]).items()},
                seed=int(data["seed"]),
                versions={str(k): str(v) for k, v in dict(data["versions"]).items()},
                weights_sha256=str(data["weights_sha256"]),
                created=str(data["created"]),
                family=str(data.get("family", "gnnaas")),
                origin=str(data.get("origin", "trained")),
                precomputed=_precomputed(data.get("precomputed")),
                axes=_axes(data.get("axes")),
                base=_base(data.get("base")),
                train_fanouts=(
                    None
                    if data.get("train_fanouts") is None
                    else [int(f) for f in data["train_fanouts"]]
                ),
                int8_ranges=_ranges(data.get("int8_ranges")),
            )
        except (TypeError, ValueError) as exc:
            raise ArtifactError(f"{source} is malformed ({exc}); regenerate the variant") from None
        manifest._check(source)
        return manifest

    def _check(self, source: str) -> None:
        """Checks that the parsed fields agree with each other: the format this gnnaas reads,
        a known family and origin, the axes against the served fanouts and width, int8 ranges
        exactly for int8, the kept features against the model's input, and the id against
        the spec it names.

        Raises:
            ArtifactError: they do not (``source`` names the manifest).
        """
        if self.format != MANIFEST_FORMAT:
            raise ArtifactError(
                f"{source} has format {self.format}, this gnnaas reads format "
                f"{MANIFEST_FORMAT}; regenerate the variant"
            )
        from gnnaas.models.base import FAMILIES

        if self.family not in FAMILIES or self.origin not in _ORIGINS:
            raise ArtifactError(
                f"{source} has family={self.family!r}, origin={self.origin!r}; "
                f"expected one of {FAMILIES} and one of {_ORIGINS}"
            )
        axes = self.axes
        if axes["fanouts"] is not None and list(axes["fanouts"]) != self.fanouts:
            raise ArtifactError(
                f"{source} serves fanouts {self.fanouts} but names the axis "
                f"fanouts={axes['fanouts']}; regenerate the variant"
            )
        if axes["hidden"] is not None and axes["hidden"] != self.hidden_channels:
            raise ArtifactError(
                f"{source} has hidden_channels={self.hidden_channels} but names the axis "
                f"hidden={axes['hidden']}; regenerate the variant"
            )
        if (self.precision == "int8") != (self.int8_ranges is not None):
            raise ArtifactError(
                f"{source} is {self.precision} but "
                f"{'has no' if self.int8_ranges is None else 'has'} int8_ranges; "
                "regenerate the variant"
            )
        if len(self.kept_features) != self.in_channels:
            raise ArtifactError(
                f"{source} keeps {len(self.kept_features)} features but its model takes "
                f"in_channels={self.in_channels}; regenerate the variant"
            )
        try:
            spec_id = self.spec.variant_id
        except ConfigError as exc:
            raise ArtifactError(f"{source} is malformed ({exc}); regenerate the variant") from None
        if self.precomputed is not None:
            spec_id += EXACT_SUFFIX
        if spec_id != self.variant_id:
            raise ArtifactError(
                f"{source} says variant_id={self.variant_id!r} but its arch/ranking/prune "
                f"make {spec_id!r}; regenerate the variant"
            )

    def matches(self, spec: VariantSpec, config: TrainConfig, *, num_features: int) -> bool:
        """Whether this manifest is what generating ``spec`` with ``config`` would produce.

        Compares the spec, the feature count (and the kept count it implies), the model's dims,
        the fanouts and the seed. Hyper-parameters the manifest does not record (learning rate,
        weight decay, epochs, batch size) are not compared.
        """
        hidden = config.hidden_channels if spec.hidden is None else spec.hidden
        fanouts = config.fanouts if spec.fanouts is None else spec.fanouts
        return (
            self.spec == spec
            and self.num_features == num_features
            and self.in_channels == num_features // spec.prune
            and self.hidden_channels == hidden
            and self.num_layers == config.num_layers
            and self.dropout == float(config.dropout)
            and self.fanouts == [int(s) for s in fanouts]
            and self.trained_fanouts == [int(s) for s in config.fanouts]
            and self.seed == config.seed
            and self.family == config.family
        )


def library_versions() -> dict[str, str]:
    """Versions of gnnaas, torch and torch_geometric, as recorded in manifests."""
    import torch_geometric

    import gnnaas

    return {
        "gnnaas": gnnaas.__version__,
        "torch": torch.__version__,
        "torch_geometric": torch_geometric.__version__,
    }


_NO_AXES: dict[str, Any] = {"fanouts": None, "hidden": None, "precision": "fp32"}


def _axes(value: Any) -> dict[str, Any]:
    """The ``axes`` object of a manifest (unset axes when absent), checked."""
    if value is None:
        return dict(_NO_AXES)
    if not isinstance(value, dict) or set(value) - set(_NO_AXES):
        raise ValueError(f"axes must be an object with keys among {list(_NO_AXES)}")
    fanouts, hidden = value.get("fanouts"), value.get("hidden")
    precision = str(value.get("precision", "fp32"))
    if precision not in PRECISIONS:
        raise ValueError(f"axes.precision must be one of {list(PRECISIONS)} (got {precision!r})")
    return {
        "fanouts": None if fanouts is None else [int(f) for f in fanouts],
        "hidden": None if hidden is None else int(hidden),
        "precision": precision,
    }


def _ranges(value: Any) -> dict[str, list[float]] | None:
    """The ``int8_ranges`` object of a manifest (``None`` when absent), checked."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError("int8_ranges must be an object of layer name -> [min, max]")
    out = {}
    for name, pair in value.items():
        if not isinstance(pair, list) or len(pair) != 2:
            raise ValueError(f"int8_ranges[{name!r}] must be [min, max] (got {pair!r})")
        out[str(name)] = [float(pair[0]), float(pair[1])]
    return out


def _base(value: Any) -> dict[str, str] | None:
    """The ``base`` object of a manifest (``None`` when absent), checked."""
    if value is None:
        return None
    if not isinstance(value, dict) or "variant" not in value or "weights_sha256" not in value:
        raise ValueError("base must be an object with keys variant and weights_sha256")
    return {"variant": str(value["variant"]), "weights_sha256": str(value["weights_sha256"])}


_PRECOMPUTED_KEYS = ("base", "graph_version", "num_nodes", "num_edges", "embedding_dim")


def _precomputed(value: Any) -> dict[str, Any] | None:
    """The ``precomputed`` object of a manifest (``None`` when absent), checked."""
    if value is None:
        return None
    if not isinstance(value, dict) or any(k not in value for k in _PRECOMPUTED_KEYS):
        raise ValueError(f"precomputed must be an object with keys {list(_PRECOMPUTED_KEYS)}")
    out = dict(value)
    for key in _PRECOMPUTED_KEYS[1:]:  # every key but "base" is a count
        out[key] = int(out[key])
    out["base"] = str(out["base"])
    return out


def _number(value: Any) -> float:
    # keeps integer metrics (epochs) integers in the JSON; rejects bools and strings
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"metric values must be numbers (got {value!r})")
    return value


def _utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
