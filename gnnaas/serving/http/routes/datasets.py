"""Served datasets and their variants."""

from __future__ import annotations

from fastapi import APIRouter

from gnnaas.inference.executor import embedding_dim
from gnnaas.policy import admitting_tolerances
from gnnaas.serving.http.deps import DatasetDep, RouterDep, dataset_of
from gnnaas.serving.http.requests import HEADER_DOCS
from gnnaas.serving.http.schemas import (
    DatasetInfo,
    DatasetList,
    ErrorResponse,
    VariantDetail,
    VariantList,
)

__all__ = ["router"]

router = APIRouter(tags=["datasets"])


@router.get("/datasets", response_model=DatasetList)
async def list_datasets(core: RouterDep) -> DatasetList:
    """Lists the served datasets."""
    return DatasetList(datasets=[DatasetInfo(**d.info()) for d in core.registry.datasets.values()])


@router.get(
    "/datasets/{dataset}",
    response_model=DatasetInfo,
    responses={404: {"model": ErrorResponse, "description": "Unknown dataset."}},
)
async def get_dataset(dataset: DatasetDep) -> DatasetInfo:
    """Describes one served dataset, as `GET /v1/datasets` lists it."""
    return DatasetInfo(**dataset.info())


@router.get(
    "/datasets/{dataset}/variants",
    response_model=VariantList,
    responses={404: {"model": ErrorResponse, "description": "Unknown dataset."}},
)
async def list_variants(core: RouterDep, dataset: DatasetDep) -> VariantList:
    """Lists a dataset's variants with their profiles and current load."""
    if core.registry.get(dataset.name) is not dataset:  # a reload swapped the set meanwhile
        dataset = dataset_of(core, dataset.name)
    snapshot = core.load_snapshot(dataset)  # what a decision under load reads
    admitted_at = admitting_tolerances(dataset.routable_candidates)
    details = []
    for v in dataset.variants.values():
        profile = v.profile
        details.append(
            VariantDetail(
                **v.describe(),
                test_accuracy=None if profile is None else profile.test_accuracy,
                fanouts=list(v.fanouts),
                hidden_channels=v.hidden_channels,
                precision=v.precision,
                base=v.base,
                routable=v.routable,
                not_routed=v.not_routed,
                dominated_by=dataset.dominated_by.get(v.variant_id),
                retimed=profile is not None and profile.retimed,
                embedding_dim=embedding_dim(v.model),
                profile=None if profile is None else profile.summary,
                queued_nodes=snapshot.load(v.variant_id).queued_nodes,
                predicted_wait_ms=round(snapshot.load(v.variant_id).wait_ms, 3),
                admissible_at=admitted_at.get(v.variant_id),
                drift=core.lane(dataset.name, v.variant_id).drift_summary(),
                precomputed=v.answers is not None,
                stale_fraction=None if v.answers is None else v.answers.stale_fraction,
                graph_version=None if v.answers is None else v.answers.graph_version,
            )
        )
    return VariantList(dataset=dataset.name, variants=details, request_headers=HEADER_DOCS)
