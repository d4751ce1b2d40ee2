"""Server settings: the shared settings plus what only a server reads, from arguments and
``GNNAAS_*`` variables.

:class:`Settings` extends :class:`gnnaas.config.SharedSettings` (folders, device, the served
pipeline: see :mod:`gnnaas.config` for why one class tree): every field can be set through the
environment with the ``GNNAAS_`` prefix, e.g. ``GNNAAS_MAX_BATCH_NODES=2048`` or
``GNNAAS_DATASETS='["Cora"]'``; the data root is read from ``GNNAAS_DATA``, as by the other
commands. Values are checked at start-up.

Example:
    >>> Settings(variants_dir="variants", max_wait_ms=1.0).max_wait_ms
    1.0
"""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import Field, SecretStr, field_validator, model_validator

from gnnaas.config import SharedSettings

__all__ = ["Settings"]


class Settings(SharedSettings):
    """Everything the router needs to start: the shared settings
    (:class:`~gnnaas.config.SharedSettings`: ``variants_dir``, ``profiles_dir``, ``data_root``,
    ``cache_dir``, ``home_dir``, ``device``, ``state_dir``, ``seed``,
    ``max_batch_nodes``, ``inline_max_nodes``, ``torch_threads``, ``feature_cache_mb``,
    ``tie_margin``) and these.

    Args:
        datasets (list[str], optional): serve only these; by default every dataset with variants and
            profiles. (default: ``None``)
        profile_split (str): profile rows whose accuracy ranks variants. (default: ``val``)
        max_wait_ms (float): how long a batch's first request waits for others while the variant
            is idle; requests arriving while a batch runs merge anyway. (default: ``0.0``)
        max_queue_nodes (int): most nodes waiting per variant before 503. (default: ``16384``)
        max_request_nodes (int): most node ids in one request before 413. (default: ``4096``)
        max_body_bytes (int): largest request body before 413, checked before parsing.
            (default: ``1048576``)
        retry_after_s (int): ``Retry-After`` sent with 503. (default: ``1``)
        load_ewma_alpha (float): weight of the newest batch in the measured/profiled service time
            ratio used for queue waits. (default: ``0.2``)
        max_concurrent_batches (int): batches running at once on the device, over all variants;
            on a CPU one batch already uses every intra-op thread. (default: ``1``)
        warmup (bool): run one forward per variant before reporting ready. (default: ``True``)
        retime_curves (bool): a variant whose service curve was measured under other execution
            settings (threads, inline threshold, device, versions) is re-timed at start-up and
            on reload, a few seconds for a dataset's variants; ``False`` leaves such variants out
            of routing, saying why. (default: ``True``)
        shutdown_timeout_s (float): how long shutdown waits for accepted requests; a reload waits
            as long for the previous variants' queued requests. (default: ``30``)
        admin_token (SecretStr, optional): bearer token of the admin endpoints
            (``GNNAAS_ADMIN_TOKEN``); unset or empty, they answer 403. (default: ``None``)
        write_token (SecretStr, optional): bearer token of the write endpoints
            (``GNNAAS_WRITE_TOKEN``); unset or empty, they answer 403. Writes also need
            ``state_dir`` (the live graphs, :mod:`gnnaas.data.live`). (default: ``None``)
        shared_store_dir (Path, optional): memory-map the graph stores and pruned feature copies
            through files in this folder so that several server processes share one copy
            (``gnnaas serve --workers`` sets it; :mod:`gnnaas.serving.deploy.workers`). (default:
            ``None``: private tensors)
        supervisor_pid (int, optional): the ``gnnaas serve --workers`` supervisor this process
            serves under (set by it): ``POST /v1/admin/reload`` points at its SIGHUP.
            (default: ``None``)
        generation (int): the generation the served set starts at (``GNNAAS_GENERATION``): the
            ``gnnaas serve --workers`` supervisor counts the SIGHUPs that replaced its workers
            and starts the new ones at ``1 +`` that count, so that ``/metrics`` shows the
            reloads of the server, not of the fresh process. (default: ``1``)
    """

    datasets: list[str] | None = None
    profile_split: str = "val"
    max_wait_ms: float = Field(default=0.0, ge=0.0, le=1000.0)
    max_queue_nodes: int = Field(default=16384, ge=1)
    max_request_nodes: int = Field(default=4096, ge=1)
    max_body_bytes: int = Field(default=1 << 20, ge=64)
    retry_after_s: int = Field(default=1, ge=1)
    load_ewma_alpha: float = Field(default=0.2, gt=0.0, le=1.0)
    max_concurrent_batches: int = Field(default=1, ge=1)
    warmup: bool = True
    retime_curves: bool = True
    shutdown_timeout_s: float = Field(default=30.0, gt=0.0)
    admin_token: SecretStr | None = None
    shared_store_dir: Path | None = None
    supervisor_pid: int | None = Field(default=None, ge=1)
    generation: int = Field(default=1, ge=1)
    write_token: SecretStr | None = None

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
        if self.state_dir is not None and self.shared_store_dir is not None:
            raise ValueError(
                "a live graph (state_dir) is served by one process: it cannot be shared by workers"
            )
        if self.datasets is not None and not self.datasets:
            raise ValueError("datasets must name at least one dataset, or be left unset for all")
        return self
