"""HTTP request and response schemas (pydantic); internal objects never leave through the API.

The predict route builds its JSON itself for speed; the response models here document it in OpenAPI.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

__all__ = [
    "DatasetInfo",
    "DatasetList",
    "ErrorResponse",
    "Health",
    "PredictRequest",
    "PredictResponse",
    "Readiness",
    "ReloadResponse",
    "StageTiming",
    "VariantDetail",
    "VariantInfo",
    "VariantList",
]


class PredictRequest(BaseModel):
    """Body of ``POST /v1/datasets/{dataset}/predict``."""

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={"examples": [{"nodes": [0, 1, 2], "return": "class"}]},
    )

    nodes: list[StrictInt] = Field(
        min_length=1,
        description="Target node ids (integers in [0, num_nodes)); duplicates are allowed.",
    )
    return_: Literal["class", "proba", "embedding"] = Field(
        default="class",
        alias="return",
        description="`class`: one class id per node (a 0/1 list per node for multi-label "
        "datasets); `proba`: class probabilities per node; `embedding`: the serving variant's "
        "last hidden layer per node (the input of its last convolution), a list of floats as "
        "wide as the variant's `embedding_dim` (its `hidden_channels`, listed by "
        "`GET /v1/datasets/{dataset}/variants`). A node's class does not depend on its "
        "batch-mates; its probabilities and embedding may differ between batches only by "
        "floating-point summation order (float32 rounding, about 1e-6 of their scale). Each "
        "variant embeds in its own space: pin one with `X-Variant` to compare embeddings "
        "across requests.",
    )


class VariantInfo(BaseModel):
    """The variant that served a request."""

    id: str = Field(description="Variant id `<arch>-<ranking>-<k>x`.")
    arch: str
    ranking: str
    prune: int = Field(description="Prune factor k: the variant keeps 1/k of the features.")
    features_kept: int
    accuracy: float | None = Field(
        description="Profiled validation accuracy in percent (null when not profiled)."
    )


class StageTiming(BaseModel):
    """Server-side time per stage, in ms (sample/gather/compute are those of the whole batch)."""

    queue: float
    sample: float
    gather: float
    compute: float
    total: float


class PredictResponse(BaseModel):
    """Predictions and how they were made."""

    variant: VariantInfo
    predictions: list[Any] = Field(
        description="One entry per requested node, in request order: a class id (a 0/1 list "
        "for multi-label datasets), a list of class probabilities (`proba`) or a list of "
        "`embedding_dim` floats (`embedding`), as the request's `return` asked."
    )
    timing_ms: StageTiming


class ErrorResponse(BaseModel):
    """Every error: a message a person can act on."""

    detail: str


class DatasetInfo(BaseModel):
    """A served dataset."""

    name: str
    num_nodes: int
    num_features: int
    num_classes: int
    multi_label: bool
    variants: int = Field(description="Loaded variants.")
    routable: int = Field(description="Variants the router may choose (profiled).")
    frontier: int = Field(
        default=0,
        description="Routable variants that no other dominates: those a request considers.",
    )
    graph_version: int = Field(
        default=0, description="Version of the live graph (0 for a graph that takes no writes)."
    )
    live: bool = Field(default=False, description="Whether the graph takes writes.")


class DatasetList(BaseModel):
    """``GET /v1/datasets``."""

    datasets: list[DatasetInfo]


class VariantDetail(BaseModel):
    """A loaded variant with its profile and current load."""

    id: str
    arch: str
    ranking: str
    prune: int
    features_kept: int
    accuracy: float | None = Field(description="Profiled validation accuracy in percent.")
    test_accuracy: float | None = Field(description="Profiled test accuracy in percent.")
    fanouts: list[int] = Field(
        default_factory=list,
        description="Neighbors sampled per hop, PyG order (the seeds' hop first; -1 all).",
    )
    hidden_channels: int | None = Field(default=None, description="Hidden width of the model.")
    precision: str = Field(
        default="fp32", description="`fp32`, or `int8` (linear layers quantized)."
    )
    base: str | None = Field(
        default=None,
        description="The variant it derives from (same weights with other fanouts or "
        "precision, or the teacher of a distilled width); null for a trained variant.",
    )
    routable: bool
    not_routed: str | None = Field(description="Why the router never chooses it, if so.")
    dominated_by: str | None = Field(
        default=None,
        description="A routable variant at least as accurate (by the tolerance rule) and at "
        "least as fast at every batch size: this one is profiled but not considered.",
    )
    retimed: bool = Field(
        default=False,
        description="Its service curve was re-timed at start-up because the profile was "
        "measured under other execution settings (threads, kernels, device, versions).",
    )
    embedding_dim: int | None = Field(
        default=None,
        description='Width of its embeddings (`"return": "embedding"`): the model\'s '
        "`hidden_channels` (its input width for a one-layer model); null when unknown.",
    )
    profile: dict[str, Any] | None = Field(
        description="The profile row (profiles.csv columns) and `service_times` by batch size."
    )
    queued_nodes: int
    predicted_wait_ms: float = Field(description="Current predicted queue wait.")
    admissible_at: float | None = Field(
        default=None,
        description="Smallest X-Accuracy-Tolerance under which the router may choose it "
        "(the tolerance rule applied to its paired accuracy interval); null if not routable.",
    )
    drift: dict[str, Any] | None = Field(
        default=None,
        description="Predicted (profiled service curve) vs measured time of its recent batches: "
        "count, median_abs_rel_error, medians, and the same by batch size.",
    )
    precomputed: bool = Field(
        default=False,
        description="A precomputed variant (`<base>@exact`, `gnnaas precompute`): every node's "
        "exact answer looked up.",
    )
    stale_fraction: float | None = Field(
        default=None,
        description="Precomputed variants: share of the graph's nodes whose answer a write "
        "changed since (the router serves them with another variant); null otherwise.",
    )
    graph_version: int | None = Field(
        default=None,
        description="Precomputed variants: the graph version their answers were computed on.",
    )


class VariantList(BaseModel):
    """``GET /v1/datasets/{dataset}/variants``."""

    dataset: str
    variants: list[VariantDetail]
    request_headers: dict[str, str] = Field(
        default_factory=dict,
        description="What each request header of the predict endpoint means (the same text as "
        "its OpenAPI schema): tolerance, SLO, deadline, priority, pinned variant.",
    )


class Health(BaseModel):
    """``/healthz``: the process is alive."""

    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    """``/readyz``: whether requests can be served, and why not."""

    status: Literal["ready", "not ready"]
    reasons: list[str] = Field(description="Why the server is not ready (empty when ready).")
    datasets: list[str]
    not_routed: dict[str, str] = Field(
        description="`<dataset>/<variant>` loaded but never chosen by the router, with the reason."
    )
    notes: list[str] = Field(
        description="Datasets or variants skipped at start-up (or the last reload), and why."
    )


class ReloadResponse(BaseModel):
    """``POST /v1/admin/reload``: what a successful reload changed."""

    generation: int = Field(
        description="Generation served now: 1 at start, +1 per successful reload (also the "
        "`gnnaas_registry_generation` metric)."
    )
    datasets: list[str] = Field(description="Datasets served now.")
    variants: int = Field(description="Variants loaded now.")
    datasets_added: list[str]
    datasets_removed: list[str]
    variants_added: int
    variants_removed: int
    variants_reprofiled: int = Field(
        description="Variants kept whose profile (or whether they are routed) changed."
    )
    changes: dict[str, list[str]] = Field(
        description="`added`, `removed` and `reprofiled`: the `<dataset>/<variant>` ids."
    )
    notes: list[str] = Field(description="What the new set skips, and why (as `/readyz`).")
    duration_ms: float = Field(description="From the request to the previous set drained.")


class NodesWrite(BaseModel):
    """``POST /v1/datasets/{dataset}/nodes``: new nodes and their edges."""

    model_config = ConfigDict(extra="forbid")

    features: list[list[float]] = Field(
        description="One row of the dataset's feature width per new node.",
        examples=[[[0.1, 0.0, 1.0]]],
    )
    edges: list[list[int]] = Field(
        default_factory=list,
        description="[source, target] pairs (source becomes an in-neighbor of target) among the "
        "new nodes and existing ones; -1 is this request's first new node, -2 its second, ...",
        examples=[[[-1, 0], [0, -1]]],
    )


class EdgesWrite(BaseModel):
    """``POST /v1/datasets/{dataset}/edges``: edges to add and to remove."""

    model_config = ConfigDict(extra="forbid")

    add: list[list[int]] = Field(default_factory=list, description="[source, target] pairs.")
    remove: list[list[int]] = Field(default_factory=list, description="[source, target] pairs.")


class FeaturesWrite(BaseModel):
    """``PUT /v1/datasets/{dataset}/nodes/{node}/features``: the node's new feature row."""

    model_config = ConfigDict(extra="forbid")

    features: list[float]


class WriteResponse(BaseModel):
    """The answer of every write: the graph version it produced (also ``X-Graph-Version``)."""

    graph_version: int
    ids: list[int] | None = Field(default=None, description="Ids of the new nodes (node writes).")
    added: int | None = None
    removed: int | None = None
