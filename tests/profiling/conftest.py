"""Fixtures of the profiling tests: a fabricated profile table."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from gnnaas.profiling.table import write_profiles, write_service_times


def fake_profile_rows(dataset: str = "Fake", *, num_features: int = 512) -> list[dict[str, Any]]:
    """Plausible rows for 2 archs × (1x + 3 rankings × 2/4/8x) × 2 splits, deterministic."""
    rows = []
    specs = [("full", 1)] + [(r, k) for r in ("random", "greedy", "lasso") for k in (2, 4, 8)]
    bonus = {"full": 0.0, "random": -3.0, "greedy": -1.0, "lasso": -0.5}
    for arch_i, arch in enumerate(("gin", "sage")):
        for ranking, prune in specs:
            kept = num_features // prune
            comm = 2.0 * kept / num_features + 0.2
            comp = 1.5 * kept / num_features + 0.4 + 0.3 * arch_i
            for split_i, split in enumerate(("val", "test")):
                acc = 85.0 + 2 * arch_i + bonus[ranking] * math.log2(prune) - 0.7 * split_i
                if arch == "gin" and ranking == "random" and prune == 8 and split == "test":
                    acc -= 4.0  # one val/test gap above 3 points
                latency = comm + comp + 0.05 * split_i
                rows.append(
                    {
                        "dataset": dataset,
                        "variant": f"{arch}-{ranking}-{prune}x",
                        "arch": arch,
                        "ranking": ranking,
                        "prune": prune,
                        "features_kept": kept,
                        "split": split,
                        "batch_size": 512,
                        "num_batches": 1,
                        "accuracy": acc,
                        "accuracy_std": 1.5,
                        "sample_ms": 0.8,
                        "comm_ms": comm,
                        "comp_ms": comp,
                        "latency_ms": latency,
                        "latency_p95_ms": latency * 1.1,
                        "latency_p99_ms": latency * 1.2,
                        "latency_std_ms": 0.05 * latency,
                        "e2e_ms": latency + 0.8,
                        "comm_comp": comm / comp,
                        "size_kb": 4 * (kept * 256 + 256 * 7) / 1024,
                        "mem_mb": 3.0 * kept / num_features + 1.0,
                        "unique_frac": 0.3,
                        "pred_comm_ms": comm * 0.8,
                        "pred_comp_ms": comp * 1.3,
                        "device": "cpu",
                        "threads": 2,
                        "torch_version": "2.13.0+cpu",
                        "date": "2026-11-23T10:00:00Z",
                    }
                )
    return rows


@pytest.fixture
def fake_rows() -> list[dict[str, Any]]:
    """Fabricated profile rows (see :func:`fake_profile_rows`)."""
    return fake_profile_rows()


@pytest.fixture
def fake_profiles_dir(tmp_path: Path) -> Path:
    """A ``profiles/Fake`` folder holding a fabricated profiles.csv and service_times.csv."""
    folder = tmp_path / "profiles" / "Fake"
    rows = fake_profile_rows()
    write_profiles(rows, folder / "profiles.csv")
    latency = {r["variant"]: r["latency_ms"] for r in rows if r["split"] == "val"}
    service = [  # each variant's curve scales with its latency: faster ones stay faster
        {
            "variant": v,
            "batch_size": b,
            "sample_ms": 0.1 * b**0.5,
            "gather_ms": 0.05 * latency[v] * b**0.5,
            "compute_ms": 0.1 * latency[v] * b**0.5,
            "e2e_ms": (0.1 + 0.15 * latency[v]) * b**0.5,
            "sampling": "depth",
            "sampler_seed": 0,
        }
        for v in sorted(latency)
        for b in (1, 32, 256, 1024)
    ]
    write_service_times(service, folder / "service_times.csv")
    return folder
