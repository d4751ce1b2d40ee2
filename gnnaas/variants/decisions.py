"""Which int8 twins a dataset gets, decided once: ``<root>/<dataset>/int8_decisions.json``.

An int8 twin (``-int8``, :mod:`gnnaas.variants.axes`) is made only where int8 is measured faster
than fp32 on the graph and machine. That timing is noisy near the threshold, so measuring it
again on every run would let each run find new winners and keep growing the variant set (each new
variant then makes the profiles stale). Instead each base variant's measurement is recorded here,
kept or not, with the base's weights' sha256 and fanouts; a later run reuses the decision while
they are unchanged (a retrained base is measured again), and ``generate --force`` decides anew.
Deleting the file makes the next run measure again without retraining anything.

The file is plain JSON, written atomically (:func:`gnnaas.utils.atomic_write_json`)::

    {"format": 1,
     "int8": {"gin-full-1x": {"base_weights_sha256": "...", "fanouts": [25, 10],
                              "speedup": 1.04, "min_speedup": 1.1, "kept": false,
                              "measured": "2025-01-01T00:00:00Z", "torch": "2.5.1",
                              "threads": 1}}}

Only the standard library at import (the CLI imports :mod:`gnnaas.variants.axes` without torch).
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gnnaas.variants.manifest import Manifest
    from gnnaas.variants.repository import VariantRepository

__all__ = ["DECISIONS_FILE", "Int8Decision", "Int8Decisions"]

_log = logging.getLogger(__name__)

DECISIONS_FILE = "int8_decisions.json"
"""The record's name in the dataset's variant folder (a file: never listed as a variant)."""
_FORMAT = 1


@dataclass(frozen=True)
class Int8Decision:
    """Whether a base variant gets an int8 twin, and the measurement that decided it.

    Args:
        base_weights_sha256 (str): the base's weights when measured.
        fanouts (list[int]): the base's serving fanouts when measured.
        speedup (float): fp32 forward time / int8 forward time (``0.0``: int8 could not run).
        min_speedup (float): the speed-up a twin needed.
        kept (bool): whether the twin is made.
        measured (str): when (UTC, ISO 8601).
        torch (str): the torch version that measured it.
        threads (int): torch's intra-op threads while measuring.
    """

    base_weights_sha256: str
    fanouts: list[int]
    speedup: float
    min_speedup: float
    kept: bool
    measured: str = ""
    torch: str = ""
    threads: int = 0

    @classmethod
    def from_dict(cls, data: Any) -> Int8Decision | None:
        """The decision ``data`` describes, or ``None`` when it is malformed (measured again)."""
        try:
            decision = cls(
                base_weights_sha256=str(data["base_weights_sha256"]),
                fanouts=[int(f) for f in data["fanouts"]],
                speedup=float(data["speedup"]),
                min_speedup=float(data["min_speedup"]),
                kept=data["kept"],
                measured=str(data.get("measured", "")),
                torch=str(data.get("torch", "")),
                threads=int(data.get("threads", 0)),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        return decision if isinstance(decision.kept, bool) else None

    def applies_to(self, base: Manifest) -> bool:
        """Whether this decision was made on ``base`` as it is now (same weights and fanouts)."""
        return self.base_weights_sha256 == base.weights_sha256 and self.fanouts == [
            int(f) for f in base.fanouts
        ]


class Int8Decisions:
    """The int8 decisions of one dataset's variants, read from and written to its record file.

    Args:
        path (Path): the record file.
        decisions (dict[str, Int8Decision]): by base variant id.
    """

    def __init__(self, path: Path, decisions: dict[str, Int8Decision]) -> None:
        self.path = path
        self.decisions = decisions

    @classmethod
    def load(cls, repo: VariantRepository, dataset: str) -> Int8Decisions:
        """The dataset's record (empty when there is none; an unreadable one is replaced, with a
        warning, as decisions are made again)."""
        path = repo.dataset_dir(dataset) / DECISIONS_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls(path, {})
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            _log.warning("%s is unreadable (%s); int8 twins are decided again", path, exc)
            return cls(path, {})
        entries = data.get("int8") if isinstance(data, dict) else None
        if not isinstance(entries, dict):
            _log.warning("%s holds no int8 decisions; int8 twins are decided again", path)
            return cls(path, {})
        decisions = {str(k): Int8Decision.from_dict(v) for k, v in entries.items()}
        return cls(path, {k: v for k, v in decisions.items() if v is not None})

    def get(self, base: Manifest) -> Int8Decision | None:
        """The recorded decision on ``base`` when it still applies, else ``None``."""
        decision = self.decisions.get(base.variant_id)
        return decision if decision is not None and decision.applies_to(base) else None

    def record(self, base: Manifest, speedup: float, min_speedup: float) -> Int8Decision:
        """Records (and writes, atomically) the decision on ``base`` from a measured ``speedup``:
        kept when it is at least ``min_speedup``."""
        import torch

        decision = Int8Decision(
            base_weights_sha256=base.weights_sha256,
            fanouts=[int(f) for f in base.fanouts],
            speedup=float(speedup),
            min_speedup=float(min_speedup),
            kept=bool(speedup >= min_speedup),
            measured=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            torch=str(torch.__version__),
            threads=int(torch.get_num_threads()),
        )
        self.decisions[base.variant_id] = decision
        self.save()
        return decision

    def save(self) -> None:
        """Writes the record atomically."""
        from gnnaas.utils import atomic_write_json

        entries = {k: asdict(v) for k, v in sorted(self.decisions.items())}
        atomic_write_json(self.path, {"format": _FORMAT, "int8": entries})
