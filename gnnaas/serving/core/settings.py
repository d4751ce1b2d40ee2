"""Server settings: one pydantic ``BaseSettings`` read from arguments and ``GNNAAS_*`` variables.

Every field can be set through the environment with the ``GNNAAS_`` prefix, e.g.
``GNNAAS_MAX_BATCH_NODES=2048`` or ``GNNAAS_DATASETS='["Cora"]'``; the data root also honours
``GNNAAS_DATA`` as the other commands do. Values are checked at start-up.

Example:
    >>> Settings(variants_dir="variants", max_wait_ms=1.0).max_wait_ms
    1.0
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings"]


class Settings(BaseSettings):
    """Everything the router needs to start.

    Args:
        variants_dir (Path): the variant repository. (default: ``variants``)
        profiles_dir (Path): the profiles folder. (default: ``profiles``)
        data_root (Path, optional): where real datasets' raw files live (``GNNAAS_DATA_ROOT`` or
            ``GNNAAS_DATA``). (default: ``None``)
        datasets (list[str], optional): serve only these; by default every dataset with variants and
            profiles. (default: ``None``)
        device (str): ``auto``, ``cpu`` or ``cuda[:n]``. (default: ``auto``)
        seed (int): seed of the serving-time consistent sampler. (default: ``0``)
        sampling (str): ``depth``: a node's answer never depends on its batch-mates (one sampled
            row per node and depth); ``shared``: PyG-style shared rows, a little less work, answers
            can drift slightly when batch-mates are neighbors. (default: ``depth``)
        profile_split (str): profile rows whose accuracy ranks variants. (default: ``val``)
        max_batch_nodes (int): most target nodes merged into one forward pass. (default: ``1024``)
        max_wait_ms (float): how long a batch's first request waits for others while the variant
            is idle; requests arriving while a batch runs merge anyway. (default: ``0.0``)
        max_queue_nodes (int): most nodes waiting per variant before 503. (default: ``16384``)
        max_request_nodes (int): most node ids in one request before 413. (default: ``4096``)
        max_body_bytes (int): largest request body before 413, checked before parsing.
            (default: ``1048576``)
        retry_after_s (int): ``Retry-After`` sent with 503. (default: ``1``)
        load_ewma_alpha (float): weight of the newest batch in the measured/profiled service time
            ratio used for queue waits. (default: ``0.2``)
        inline_max_nodes (int): batches of at most this many nodes run on the event loop's thread
            instead of the variant's worker thread (no thread hand-off); the profiler times them
            the same way (profile with the value you serve with). ``0`` runs every batch in the
            worker thread. (default: ``16``)
        max_concurrent_batches (int): batches running at once on the device, over all variants;
            on a CPU one batch already uses every intra-op thread. (default: ``1``)
        tie_margin (float): predicted completion times within this fraction of the fastest
            candidate's count as ties, won by the most accurate; keeps profiling noise between
            variants of nearly equal speed from scattering requests. (default: ``0.1``)
        torch_threads (int): intra-op threads of torch for the server process, and the default
            of ``gnnaas profile`` too, so that profiles are measured as they are served (a
            server under other threads re-times the curves). One thread leaves the other cores
            to the event loop, the client and other workers; batches of a few nodes gain
            nothing from more. (default: ``1``)
        warmup (bool): run one forward per variant before reporting ready. (default: ``True``)
        retime_curves (bool): a variant whose service curve was measured under other execution
            settings (threads, fused forward, compiled sampler, inline threshold, device,
            versions) is re-timed at start-up and on reload, a few seconds for a dataset's
            variants; ``False`` leaves such variants out of routing, saying why.
            (default: ``True``)
        fast_lane (bool): answer well-formed predict requests without FastAPI's per-request
            machinery (:mod:`gnnaas.serving.http.fastlane`; errors still go through FastAPI).
            (default: ``True``)
        shutdown_timeout_s (float): how long shutdown waits for accepted requests; a reload waits
            as long for the previous variants' queued requests. (default: ``30``)
        admin_token (SecretStr, optional): bearer token of the admin endpoints
            (``GNNAAS_ADMIN_TOKEN``); unset or empty, they answer 403. (default: ``None``)
        state_dir (Path, optional): make the served graphs live: writes are logged under
            ``<state_dir>/<dataset>/`` and replayed at start (:mod:`gnnaas.data.live`); needs the
            ``depth`` sampler. (default: ``None``: frozen graphs, writes answer 403)
        write_token (SecretStr, optional): bearer token of the write endpoints
            (``GNNAAS_WRITE_TOKEN``); unset or empty, they answer 403. (default: ``None``)
        shared_store_dir (Path, optional): memory-map the graph stores and pruned feature copies
            through files in this folder so that several server processes share one copy
            (``gnnaas serve --workers`` sets it; :mod:`gnnaas.serving.deploy.workers`). (default:
            ``None``: private tensors)
        feature_cache_mb (float): device memory (MiB) for feature caches on CUDA: the pruned
            rows of each served variant's most read nodes stay on the GPU and a batch copies only
            the others (:mod:`gnnaas.inference.cache`). One budget for every served variant, split
            by traffic share (equal at start-up) and marginal hit gain
            (:func:`gnnaas.profiling.cacheplan.split_budget`); nodes in the order ``gnnaas
            cache-plan`` wrote beside the profiles, else by neighbor count. Ignored on the CPU
            (the features are already local) and for live graphs. ``0`` turns caching off.
            (default: ``0``)
    """

    model_config = SettingsConfigDict(env_prefix="GNNAAS_", extra="forbid", frozen=True)

    variants_dir: Path = Path("variants")
    profiles_dir: Path = Path("profiles")
    data_root: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("data_root", "GNNAAS_DATA_ROOT", "GNNAAS_DATA"),
    )
    datasets: list[str] | None = None
    device: str = "auto"
    seed: int = 0
    sampling: Literal["depth", "shared"] = "depth"
    profile_split: str = "val"
    max_batch_nodes: int = Field(default=1024, ge=1)
    max_wait_ms: float = Field(default=0.0, ge=0.0, le=1000.0)
    max_queue_nodes: int = Field(default=16384, ge=1)
    max_request_nodes: int = Field(default=4096, ge=1)
    max_body_bytes: int = Field(default=1 << 20, ge=64)
    retry_after_s: int = Field(default=1, ge=1)
    load_ewma_alpha: float = Field(default=0.2, gt=0.0, le=1.0)
    max_concurrent_batches: int = Field(default=1, ge=1)
    # gnnaas.inference.INLINE_MAX_NODES, spelled out so that reading settings loads no torch (the
    # supervisor of --workers stays small); a test keeps the two equal.
    inline_max_nodes: int = Field(default=16, ge=0, le=1024)
    tie_margin: float = Field(default=0.1, ge=0.0, le=10.0)
    torch_threads: int = Field(default=1, ge=1)
    warmup: bool = True
    retime_curves: bool = True
    fast_lane: bool = True
    shutdown_timeout_s: float = Field(default=30.0, gt=0.0)
    admin_token: SecretStr | None = None
    shared_store_dir: Path | None = None
    supervisor_pid: int | None = Field(default=None, ge=1)
    state_dir: Path | None = None
    write_token: SecretStr | None = None
    feature_cache_mb: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)

    @field_validator("admin_token", "write_token", mode="before")
    @classmethod
    def _blank_token_is_none(cls, value: object) -> object:
        # An empty GNNAAS_ADMIN_TOKEN= means "not set", never "the empty token".
        return None if isinstance(value, str) and not value.strip() else value

    @model_validator(mode="after")
    def _check_limits(self) -> Self:
        if self.max_request_nodes > self.max_queue_nodes:
            raise ValueError(
                f"max_request_nodes ({self.max_request_nodes}) must not exceed max_queue_nodes "
                f"({self.max_queue_nodes}), or a request could never be queued"
            )
        if self.state_dir is not None and self.sampling != "depth":
            raise ValueError("a live graph (state_dir) needs sampling='depth'")
        if self.state_dir is not None and self.shared_store_dir is not None:
            raise ValueError(
                "a live graph (state_dir) is served by one process: it cannot be shared by workers"
            )
        if self.datasets is not None and not self.datasets:
            raise ValueError("datasets must name at least one dataset, or be left unset for all")
        return self
