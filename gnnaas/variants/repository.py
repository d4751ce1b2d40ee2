"""The variant repository: ``<root>/<dataset>/<variant-id>/{weights.safetensors, manifest.json}``.

A variant folder holds the model's weights in safetensors (never pickled) and a text manifest with
everything needed to rebuild the model (arch, dims, kept feature ids), the training metrics, the
seed, the library versions and the sha256 of the weights file (docs/internals.md, "variants").

Writes are atomic: a variant is written into a hidden temporary folder next to its final place and
then renamed into place; an existing variant is renamed aside first and deleted only once the new
one is in place. Readers therefore never see half a variant, and an interrupted run keeps the old
one. Hidden folders (``.``-prefixed: temporaries, set-aside old versions) are never listed.

This module holds the file operations; what a variant is and what its manifest says
(:class:`VariantSpec`, :class:`Manifest`, the format's constants) live in
:mod:`gnnaas.variants.manifest` and are re-exported here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from gnnaas.errors import ArtifactError, ConfigError
from gnnaas.typing import Device, PathType
from gnnaas.variants.manifest import (
    EXACT_SUFFIX,
    FULL_RANKING,
    MANIFEST_FORMAT,
    USER_RANKING,
    Manifest,
    VariantSpec,
    library_versions,
)

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

_WEIGHTS = "weights.safetensors"
_MANIFEST = "manifest.json"
_ANSWERS = "answers.safetensors"


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

    def dataset_dir(self, dataset: str) -> Path:
        """The folder of one dataset's variants (whether it exists or not)."""
        return self._dataset_dir(dataset)

    def _dataset_dir(self, dataset: str) -> Path:
        if not _is_plain_name(dataset):
            raise ConfigError(f"invalid dataset name {dataset!r} for a variant folder")
        return self.root / dataset

    def list(self, dataset: str) -> list[Manifest]:
        """Manifests of the dataset's variants, sorted by variant id.

        Hidden folders (temporaries of a running or interrupted save) are skipped; so are folders
        whose manifest is unreadable or belongs elsewhere, with a warning (:meth:`scan` says
        why). Checksums are not verified here; :meth:`load` does.
        """
        manifests, unreadable = self.scan(dataset)
        for variant_id, reason in unreadable:
            _log.warning("skipping variant %s/%s: %s", dataset, variant_id, reason)
        return manifests

    def scan(self, dataset: str) -> tuple[list[Manifest], list[tuple[str, str]]]:
        """The dataset's readable manifests (sorted by variant id) and, for every other variant
        folder, why its manifest cannot be used (hidden folders, a save's temporaries, are
        skipped).

        Returns:
            tuple: the manifests, and ``(folder name, reason)`` of the unreadable ones.
        """
        folder = self._dataset_dir(dataset)
        if not folder.is_dir():
            return [], []
        manifests, unreadable = [], []
        for child in sorted(folder.iterdir()):
            if child.name.startswith(".") or not child.is_dir():
                continue
            try:
                manifests.append(self._read_manifest(dataset, child.name))
            except (ArtifactError, ConfigError) as exc:
                unreadable.append((child.name, str(exc)))
        return sorted(manifests, key=lambda m: m.variant_id), unreadable

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
