"""The variant repository: ``<root>/<dataset>/<variant-id>/{weights.safetensors, manifest.json}``.

A variant folder holds the model's weights in safetensors (never pickled) and a text manifest with
everything needed to rebuild the model (arch, dims, kept feature ids), the training metrics, the
seed, the library versions and the sha256 of the weights file (docs/internals.md, "variants").

Writes are atomic: a variant is written into a hidden temporary folder next to its final place and
then renamed into place; an existing variant is renamed aside first and deleted only once the new
one is in place. Readers therefore never see half a variant, and an interrupted run keeps the old
one. Hidden folders (``.``-prefixed: temporaries, set-aside old versions) are never listed.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gnnaas.errors import ArtifactError, ConfigError
from gnnaas.models.quantize import PRECISIONS
from gnnaas.typing import Device, PathType
from gnnaas.variants.ranking import Ranking

if TYPE_CHECKING:
    from gnnaas.models import GNN
    from gnnaas.variants.training import TrainConfig

__all__ = [
    "EXACT_SUFFIX",
    "FULL_RANKING",
    "MANIFEST_FORMAT",
    "USER_RANKING",
    "LoadedVariant",
    "Manifest",
    "VariantRepository",
    "VariantSpec",
    "library_versions",
]

_log = logging.getLogger(__name__)

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

_WEIGHTS = "weights.safetensors"
_MANIFEST = "manifest.json"
_ANSWERS = "answers.safetensors"

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

    ``weights_sha256`` is empty until :meth:`VariantRepository.save` fills it in.
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
        if manifest.format != MANIFEST_FORMAT:
            raise ArtifactError(
                f"{source} has format {manifest.format}, this gnnaas reads format "
                f"{MANIFEST_FORMAT}; regenerate the variant"
            )
        from gnnaas.models.base import FAMILIES

        if manifest.family not in FAMILIES or manifest.origin not in _ORIGINS:
            raise ArtifactError(
                f"{source} has family={manifest.family!r}, origin={manifest.origin!r}; "
                f"expected one of {FAMILIES} and one of {_ORIGINS}"
            )
        axes = manifest.axes
        if axes["fanouts"] is not None and list(axes["fanouts"]) != manifest.fanouts:
            raise ArtifactError(
                f"{source} serves fanouts {manifest.fanouts} but names the axis "
                f"fanouts={axes['fanouts']}; regenerate the variant"
            )
        if axes["hidden"] is not None and axes["hidden"] != manifest.hidden_channels:
            raise ArtifactError(
                f"{source} has hidden_channels={manifest.hidden_channels} but names the axis "
                f"hidden={axes['hidden']}; regenerate the variant"
            )
        if (manifest.precision == "int8") != (manifest.int8_ranges is not None):
            raise ArtifactError(
                f"{source} is {manifest.precision} but "
                f"{'has no' if manifest.int8_ranges is None else 'has'} int8_ranges; "
                "regenerate the variant"
            )
        if len(manifest.kept_features) != manifest.in_channels:
            raise ArtifactError(
                f"{source} keeps {len(manifest.kept_features)} features but its model takes "
                f"in_channels={manifest.in_channels}; regenerate the variant"
            )
        try:
            spec_id = manifest.spec.variant_id
        except ConfigError as exc:
            raise ArtifactError(f"{source} is malformed ({exc}); regenerate the variant") from None
        if manifest.precomputed is not None:
            spec_id += EXACT_SUFFIX
        if spec_id != manifest.variant_id:
            raise ArtifactError(
                f"{source} says variant_id={manifest.variant_id!r} but its arch/ranking/prune "
                f"make {spec_id!r}; regenerate the variant"
            )
        return manifest

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


@dataclass
class LoadedVariant:
    """A variant read back from the repository: its manifest and its model (in ``eval()`` mode)."""

    manifest: Manifest
    model: GNN


class VariantRepository:
    """Variants on disk under ``root`` (``<root>/<dataset>/<variant-id>/``).

    Creating a repository touches nothing on disk; :meth:`save` creates folders as needed.

    Args:
        root (str or PathLike): the repository folder (e.g. ``variants``).

    Example:
        >>> repo = VariantRepository("variants")
        >>> [m.variant_id for m in repo.list("Cora")]  # doctest: +SKIP
        ['gin-full-1x', 'gin-greedy-2x', ...]
    """

    def __init__(self, root: PathType) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"VariantRepository({str(self.root)!r})"

    def path(self, dataset: str, variant_id: str) -> Path:
        """The folder of one variant (whether it exists or not)."""
        if not _is_plain_name(variant_id):
            raise ConfigError(f"invalid variant id {variant_id!r}; expected <arch>-<ranking>-<k>x")
        return self._dataset_dir(dataset) / variant_id

    def _dataset_dir(self, dataset: str) -> Path:
        if not _is_plain_name(dataset):
            raise ConfigError(f"invalid dataset name {dataset!r} for a variant folder")
        return self.root / dataset

    def list(self, dataset: str) -> list[Manifest]:
        """Manifests of the dataset's variants, sorted by variant id.

        Hidden folders (temporaries of a running or interrupted save) are skipped; so are folders
        whose manifest is unreadable or belongs elsewhere, with a warning (``load`` says why).
        Checksums are not verified here; :meth:`load` does.
        """
        folder = self._dataset_dir(dataset)
        if not folder.is_dir():
            return []
        manifests = []
        for child in sorted(folder.iterdir()):
            if child.name.startswith(".") or not child.is_dir():
                continue
            try:
                manifests.append(self._read_manifest(dataset, child.name))
            except ArtifactError as exc:
                _log.warning("skipping variant %s/%s: %s", dataset, child.name, exc)
        return sorted(manifests, key=lambda m: m.variant_id)

    def manifest(self, dataset: str, variant_id: str) -> Manifest:
        """Reads and checks one variant's manifest (no checksum; see :meth:`load`).

        Raises:
            ArtifactError: the variant or its manifest is missing, malformed or of another dataset.
        """
        return self._read_manifest(dataset, variant_id)

    def load(self, dataset: str, variant_id: str, device: Device = "cpu") -> LoadedVariant:
        """Rebuilds a variant's model from its manifest and loads its checked weights.

        Args:
            dataset (str): the dataset folder name.
            variant_id (str): e.g. ``sage-lasso-4x``.
            device (str or torch.device, optional): where to put the model. (default: ``cpu``)

        Returns:
            LoadedVariant: the manifest and the model in ``eval()`` mode.

        Raises:
            ArtifactError: missing files, malformed manifest, a manifest of another dataset, or
                weights whose sha256 differs from the manifest's (corrupt or hand-edited).
        """
        from safetensors import SafetensorError
        from safetensors.torch import load as st_load

        from gnnaas.models import build_model

        manifest = self._read_manifest(dataset, variant_id)
        data = self._read_checked_weights(manifest)
        try:
            state = st_load(data)
        except (SafetensorError, ValueError) as exc:
            raise ArtifactError(
                f"weights of variant {dataset}/{variant_id} are not valid safetensors ({exc}); "
                f"regenerate with `gnnaas generate --dataset {dataset} --force`"
            ) from None
        model = build_model(
            manifest.arch,
            manifest.in_channels,
            manifest.hidden_channels,
            manifest.out_channels,
            num_layers=manifest.num_layers,
            dropout=manifest.dropout,
            family=manifest.family,
        )
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            raise ArtifactError(
                f"weights of variant {dataset}/{variant_id} do not fit the model its manifest "
                f"describes ({exc}); regenerate with `gnnaas generate --dataset {dataset} --force`"
            ) from None
        if manifest.origin == "trained":  # a user's master may not have been trained sampled
            model.train_fanouts = tuple(manifest.trained_fanouts)
        model.to(device).eval()
        if manifest.precision == "int8":
            from gnnaas.models.quantize import quantize_int8

            if torch.device(device).type != "cpu":
                raise ArtifactError(
                    f"variant {dataset}/{variant_id} is int8, which runs on the CPU only "
                    f"(asked for {device}); serve it on a CPU, or leave it out"
                )
            try:
                model = quantize_int8(model, manifest.int8_ranges or {})
            except (TypeError, ValueError) as exc:
                raise ArtifactError(
                    f"variant {dataset}/{variant_id}: its int8_ranges do not fit its model "
                    f"({exc}); regenerate with `gnnaas generate --dataset {dataset} --force`"
                ) from None
        return LoadedVariant(manifest=manifest, model=model)

    def verify(self, dataset: str, variant_id: str) -> Manifest:
        """Checks a variant's manifest and weights checksum without building the model.

        Raises:
            ArtifactError: as :meth:`load`.
        """
        manifest = self._read_manifest(dataset, variant_id)
        self._read_checked_weights(manifest)
        return manifest

    def load_answers(self, manifest: Manifest) -> dict[str, torch.Tensor]:
        """A precomputed variant's checked answers: ``logits`` ``[N, C]`` and ``embeddings``
        ``[N, H]`` (read from ``answers.safetensors``, sha256 verified).

        Raises:
            ArtifactError: ``manifest`` is not a precomputed variant's, or its answers are
                missing, corrupt or not safetensors.
        """
        from safetensors import SafetensorError
        from safetensors.torch import load as st_load

        info = manifest.precomputed
        if info is None:
            raise ArtifactError(f"variant {manifest.variant_id} is not a precomputed variant")
        path = self.path(manifest.dataset, manifest.variant_id) / _ANSWERS
        redo = (
            f"run `gnnaas precompute --dataset {manifest.dataset} --variant {info['base']}` again"
        )
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ArtifactError(f"{path} cannot be read ({exc}); {redo}") from None
        if hashlib.sha256(data).hexdigest() != info.get("answers_sha256"):
            raise ArtifactError(f"{path} is corrupt or was edited (sha256 mismatch); {redo}")
        try:
            answers = st_load(data)
        except (SafetensorError, ValueError) as exc:
            raise ArtifactError(f"{path} is not valid safetensors ({exc}); {redo}") from None
        if "logits" not in answers or answers["logits"].size(0) != int(info["num_nodes"]):
            raise ArtifactError(f"{path} does not hold {info['num_nodes']} nodes' logits; {redo}")
        return answers

    def matches(self, spec: VariantSpec, config: TrainConfig, *, num_features: int) -> bool:
        """Whether a stored, intact variant matches the request ``spec`` + ``config``.

        A missing, malformed or corrupt (checksum mismatch) variant does not match, so generating
        again replaces it.
        """
        try:
            manifest = self.verify(spec.dataset, spec.variant_id)
        except ArtifactError as exc:
            if self.path(spec.dataset, spec.variant_id).exists():
                _log.warning("variant %s will be regenerated: %s", spec.variant_id, exc)
            return False
        return manifest.matches(spec, config, num_features=num_features)

    def save(
        self,
        manifest: Manifest,
        model: torch.nn.Module,
        answers: Mapping[str, torch.Tensor] | None = None,
    ) -> Manifest:
        """Writes a variant atomically and returns its manifest with ``weights_sha256`` filled in.

        The weights and manifest go to a hidden temporary folder in ``<root>/<dataset>/``, which
        is then renamed to ``<variant-id>``. An existing variant is renamed aside first and deleted
        only after the new one is in place; if anything fails, the old one is put back.

        Args:
            manifest (Manifest): the variant's manifest; its ``weights_sha256`` is ignored.
            model (torch.nn.Module): the trained model; its ``state_dict`` is saved.
            answers (Mapping[str, Tensor], optional): a precomputed variant's ``logits`` ``[N, C]``
                and ``embeddings`` ``[N, H]``, saved as ``answers.safetensors`` with their sha256
                in ``manifest.precomputed``. (default: ``None``)

        Returns:
            Manifest: the manifest as written.
        """
        from safetensors.torch import save as st_save

        final = self.path(manifest.dataset, manifest.variant_id)
        state = {k: v.detach().cpu().clone().contiguous() for k, v in model.state_dict().items()}
        data = st_save(state, metadata={"format": "pt", "variant_id": manifest.variant_id})
        manifest = replace(manifest, weights_sha256=hashlib.sha256(data).hexdigest())
        answers_data = None
        if answers is not None:
            if manifest.precomputed is None:
                raise ValueError("answers are saved only with a precomputed variant's manifest")
            tensors = {k: v.detach().cpu().contiguous() for k, v in answers.items()}
            answers_data = st_save(tensors, metadata={"variant_id": manifest.variant_id})
            digest = hashlib.sha256(answers_data).hexdigest()
            manifest = replace(
                manifest, precomputed={**manifest.precomputed, "answers_sha256": digest}
            )
        Manifest.from_dict(manifest.to_dict(), source=f"manifest of {manifest.variant_id}")

        folder = final.parent
        folder.mkdir(parents=True, exist_ok=True)
        # os.mkdir honours the umask (tempfile.mkdtemp would make the variant private, 0700)
        tmp = folder / f".{manifest.variant_id}.tmp-{uuid.uuid4().hex[:12]}"
        os.mkdir(tmp)
        try:
            _write_synced(tmp / _WEIGHTS, data)
            if answers_data is not None:
                _write_synced(tmp / _ANSWERS, answers_data)
            _write_synced(tmp / _MANIFEST, _manifest_json(manifest).encode("utf-8"))
            self._swap_in(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _log.info("saved variant %s/%s", manifest.dataset, manifest.variant_id)
        return manifest

    # ------------------------------------------------------------------------------------------

    def _swap_in(self, tmp: Path, final: Path) -> None:
        if not final.exists():
            os.replace(tmp, final)
            _fsync_dir(final.parent)
            return
        old = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(final, old)
        try:
            os.replace(tmp, final)
        except BaseException:
            os.replace(old, final)  # put the previous variant back
            raise
        _fsync_dir(final.parent)
        shutil.rmtree(old, ignore_errors=True)

    def _read_manifest(self, dataset: str, variant_id: str) -> Manifest:
        folder = self.path(dataset, variant_id)
        path = folder / _MANIFEST
        if not folder.is_dir():
            raise ArtifactError(
                f"variant {dataset}/{variant_id} not found in {self.root}; "
                f"generate it with `gnnaas generate --dataset {dataset}`"
            )
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ArtifactError(
                f"{path} is missing; regenerate with `gnnaas generate --dataset {dataset} --force`"
            ) from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ArtifactError(
                f"{path} is unreadable ({exc}); "
                f"regenerate with `gnnaas generate --dataset {dataset} --force`"
            ) from None
        if not isinstance(data, dict):
            raise ArtifactError(f"{path} is not a JSON object; regenerate the variant")
        manifest = Manifest.from_dict(data, source=str(path))
        if manifest.dataset != dataset:
            raise ArtifactError(
                f"{path} describes a variant of dataset {manifest.dataset!r}, not {dataset!r}; "
                f"move it to {self.root / manifest.dataset} or regenerate with "
                f"`gnnaas generate --dataset {dataset} --force`"
            )
        if manifest.variant_id != variant_id:
            raise ArtifactError(
                f"{path} describes variant {manifest.variant_id!r}, not the folder's "
                f"{variant_id!r}; regenerate with `gnnaas generate --dataset {dataset} --force`"
            )
        return manifest

    def _read_checked_weights(self, manifest: Manifest) -> bytes:
        path = self.path(manifest.dataset, manifest.variant_id) / _WEIGHTS
        regen = f"regenerate with `gnnaas generate --dataset {manifest.dataset} --force`"
        if manifest.origin == "user":  # gnnaas cannot retrain what the user brought
            regen = (
                f"add it again with `gnnaas variants add --dataset {manifest.dataset} ... --force`"
                if manifest.prune > 1
                else f"bring it again with `gnnaas generate --dataset {manifest.dataset} "
                "--from-model ... --model-config ...`"
            )
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ArtifactError(f"{path} is missing; {regen}") from None
        except OSError as exc:
            raise ArtifactError(f"{path} is unreadable ({exc}); {regen}") from None
        digest = hashlib.sha256(data).hexdigest()
        if digest != manifest.weights_sha256:
            raise ArtifactError(
                f"{path} is corrupt or was edited: its sha256 {digest[:12]}... does not match the "
                f"manifest's {manifest.weights_sha256[:12]}...; {regen}"
            )
        return data


def library_versions() -> dict[str, str]:
    """Versions of gnnaas, torch and torch_geometric, as recorded in manifests."""
    import torch_geometric

    import gnnaas

    return {
        "gnnaas": gnnaas.__version__,
        "torch": torch.__version__,
        "torch_geometric": torch_geometric.__version__,
    }


def _is_plain_name(name: str) -> bool:
    # one path component, not hidden: no way out of the repository, never a temporary folder
    return bool(name) and not name.startswith(".") and not any(c in name for c in "/\\\0")


def _manifest_json(manifest: Manifest) -> str:
    """Indented JSON with the (long) kept feature list on one line."""
    data = manifest.to_dict()
    kept = json.dumps(data["kept_features"])
    data["kept_features"] = "@kept@"
    text = json.dumps(data, indent=2).replace('"@kept@"', kept, 1)
    return text + "\n"


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


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
