"""Prometheus metrics of one app, in their own :class:`~prometheus_client.CollectorRegistry`.

Several apps in one process (tests, benchmarks) never share counters. Queue depth is read from the
batchers at scrape time, so it is always current and costs nothing per request. Every metric is
defined once in :data:`METRICS` (name, type, labels, meaning: its ``# HELP`` text), which builds
it here and writes the README's table of metrics (``scripts/readme_tables.py``).

The ``gnnaas_batch_*_seconds`` pair is each variant's predicted batch time (its profiled service
curve, no load factor) and measured batch time; ``gnnaas_batch_time_rel_error`` is the median
relative error ``measured / predicted - 1`` (signed, and absolute) over the variant's recent
batches (:class:`~gnnaas.serving.core.drift.DriftRecord`), read at scrape time; the ``*_scaled``
stats are the same against the router's prediction (the curve times the device's speed at the
batch's size).

Several worker processes (``gnnaas serve --workers N``) share prometheus-client's multiprocess mode
(``PROMETHEUS_MULTIPROC_DIR`` set before the process starts): counters and histograms are summed
over the workers, ``gnnaas_registry_generation`` is the largest live one, the load gauges are summed
over live workers, and the drift gauges are one series per worker (a ``pid`` label). Those
scrape-time values are published by each worker every :data:`PUBLISH_INTERVAL_S` (and by the
worker answering the scrape at once), so another worker's figure can be that much old.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gnnaas.serving.core.drift import DriftRecord

__all__ = [
    "CONTENT_TYPE",
    "METRICS",
    "PUBLISH_INTERVAL_S",
    "MetricDoc",
    "QueueDepth",
    "ServingMetrics",
    "multiprocess_dir",
]

PUBLISH_INTERVAL_S = 1.0
"""How often a worker publishes its scrape-time gauges in multiprocess mode."""


def multiprocess_dir() -> str | None:
    """prometheus-client's multiprocess folder when this process runs in that mode."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    return path if path and os.path.isdir(path) else None


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class MetricDoc:
    """One metric as ``/metrics`` exposes it.

    Args:
        name (str): its name as scraped (a counter's ends in ``_total``).
        kind (str): ``counter``, ``gauge`` or ``histogram``.
        labels (tuple[str, ...]): its label names.
        meaning (str): what it counts or measures (its ``# HELP`` text).
    """

    name: str
    kind: str
    labels: tuple[str, ...]
    meaning: str


_VARIANT = ("dataset", "variant")
METRICS: dict[str, MetricDoc] = {
    m.name: m
    for m in (
        MetricDoc("gnnaas_requests_total", "counter", _VARIANT, "Predict requests answered"),
        MetricDoc("gnnaas_nodes_total", "counter", _VARIANT, "Target nodes answered"),
        MetricDoc(
            "gnnaas_stage_seconds",
            "histogram",
            (*_VARIANT, "stage"),
            "Per-request latency by stage: queue, then the batch's sample, gather (with the "
            "copies to and from a GPU) and compute, and total",
        ),
        MetricDoc("gnnaas_batches_total", "counter", _VARIANT, "Batches executed"),
        MetricDoc("gnnaas_batch_nodes", "histogram", _VARIANT, "Nodes per batch"),
        MetricDoc("gnnaas_batch_errors_total", "counter", _VARIANT, "Failed batches"),
        MetricDoc("gnnaas_queue_depth_nodes", "gauge", _VARIANT, "Nodes waiting per variant, now"),
        MetricDoc(
            "gnnaas_in_flight_nodes", "gauge", _VARIANT, "Nodes in the variant's running batch"
        ),
        MetricDoc(
            "gnnaas_rejections_total",
            "counter",
            ("reason",),
            "Requests refused, by reason: overloaded (503), expired (504), "
            "deadline_unmeetable, invalid_body, invalid_nodes, invalid_write (422), "
            "too_many_nodes, body_too_large (413), bad_header, bad_value (400), not_found "
            "(404), unauthorized (401), admin_disabled, writes_disabled (403)",
        ),
        MetricDoc(
            "gnnaas_admission_total",
            "counter",
            ("dataset", "priority", "outcome"),
            "Predict requests by priority and outcome: admitted (answered), shed at admission "
            "(shed_deadline: not predicted to meet its deadline under the load; "
            "shed_queue_full; shed_evicted for higher priorities), unmeetable (a deadline no "
            "variant meets even alone), expired in the queue (deadline passed before compute) "
            "or late (computed, ready after the deadline, discarded)",
        ),
        MetricDoc(
            "gnnaas_batch_predicted_seconds",
            "histogram",
            _VARIANT,
            "Batch time predicted by the variant's profiled service curve (no load factor)",
        ),
        MetricDoc(
            "gnnaas_batch_measured_seconds",
            "histogram",
            _VARIANT,
            "Measured batch time (handler wall time)",
        ),
        MetricDoc(
            "gnnaas_batch_time_rel_error",
            "gauge",
            (*_VARIANT, "stat"),
            "Median relative error measured/predicted - 1 of recent batch times; stat: "
            "median_abs, median, and the same against the router's prediction "
            "(median_abs_scaled, median_scaled)",
        ),
        MetricDoc(
            "gnnaas_batch_time_samples",
            "gauge",
            _VARIANT,
            "Recent batches behind gnnaas_batch_time_rel_error",
        ),
        MetricDoc(
            "gnnaas_event_loop_lag_seconds",
            "histogram",
            (),
            "How late the event loop ran its ticks (a few milliseconds apart while requests "
            "with X-Deadline-Ms arrive): the wait before the app reads a request and before a "
            "computed answer is sent, which admission counts against each deadline",
        ),
        MetricDoc(
            "gnnaas_reloads_total",
            "counter",
            ("outcome",),
            "Reloads of variants and profiles, by outcome (ok, failed)",
        ),
        MetricDoc(
            "gnnaas_priority_rate_limit",
            "gauge",
            ("dataset", "priority"),
            "Requests per second of a lower priority (normal, low) with a deadline admitted at "
            "most, cut while high-priority requests miss their deadlines (+Inf: no limit)",
        ),
        MetricDoc(
            "gnnaas_registry_generation",
            "gauge",
            (),
            "Generation of the served set of variants (1 at start, +1 per successful reload)",
        ),
    )
}
"""Every metric of :class:`ServingMetrics`, by name. With ``--workers`` the drift gauges
(``gnnaas_batch_time_rel_error``, ``gnnaas_batch_time_samples``) also carry a ``pid`` label."""


def _metric(kind: type, name: str, registry: CollectorRegistry, **kwargs: Any) -> Any:
    """The metric ``name`` of :data:`METRICS`, built with its help text and labels."""
    doc = METRICS[name]
    return kind(doc.name, doc.meaning, list(doc.labels), registry=registry, **kwargs)


def _family(name: str) -> GaugeMetricFamily:
    """A scrape-time gauge family of :data:`METRICS`."""
    doc = METRICS[name]
    return GaugeMetricFamily(doc.name, doc.meaning, labels=list(doc.labels))


_LATENCY_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
)  # fmt: skip
_STAGES = ("queue", "sample", "gather", "compute", "total")
# The stat label of gnnaas_batch_time_rel_error and the DriftRecord.summary() field behind it.
_DRIFT_STATS = (
    ("median_abs", "median_abs_rel_error"),
    ("median", "median_rel_error"),
    ("median_abs_scaled", "median_abs_rel_error_scaled"),
    ("median_scaled", "median_rel_error_scaled"),
)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


@dataclass(frozen=True)
class QueueDepth:
    """Load of one variant at scrape time."""

    dataset: str
    variant: str
    queued_nodes: int
    in_flight_nodes: int


class _QueueCollector(Collector):
    def __init__(self, source: Callable[[], Iterable[QueueDepth]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        queued = _family("gnnaas_queue_depth_nodes")
        running = _family("gnnaas_in_flight_nodes")
        for q in self._source():
            queued.add_metric([q.dataset, q.variant], q.queued_nodes)
            running.add_metric([q.dataset, q.variant], q.in_flight_nodes)
        yield queued
        yield running


class _LimitCollector(Collector):
    def __init__(self, source: Callable[[], Iterable[tuple[str, str, float]]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        limits = _family("gnnaas_priority_rate_limit")
        for dataset, priority, limit in self._source():
            limits.add_metric([dataset, priority], limit)
        yield limits


class _DriftCollector(Collector):
    def __init__(self, records: dict[tuple[str, str], DriftRecord]) -> None:
        self._records = records

    def collect(self) -> Iterator[Metric]:
        error = _family("gnnaas_batch_time_rel_error")
        count = _family("gnnaas_batch_time_samples")
        for (dataset, variant), record in list(self._records.items()):
            summary = record.summary()
            count.add_metric([dataset, variant], summary["count"])
            if summary["count"]:
                for stat, field in _DRIFT_STATS:
                    error.add_metric([dataset, variant, stat], summary[field])
        yield error
        yield count


class ServingMetrics:
    """The router's metrics.

    Example:
        >>> m = ServingMetrics()
        >>> m.rejected("overloaded")
        >>> b"gnnaas_rejections_total" in m.render()
        True
    """

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.requests = _metric(Counter, "gnnaas_requests_total", r)
        self.nodes = _metric(Counter, "gnnaas_nodes_total", r)
        self.stage_seconds = _metric(
            Histogram, "gnnaas_stage_seconds", r, buckets=_LATENCY_BUCKETS_S
        )
        self.batches = _metric(Counter, "gnnaas_batches_total", r)
        self.batch_nodes = _metric(Histogram, "gnnaas_batch_nodes", r, buckets=_BATCH_BUCKETS)
        self.batch_errors = _metric(Counter, "gnnaas_batch_errors_total", r)
        self.rejections = _metric(Counter, "gnnaas_rejections_total", r)
        self.admission = _metric(Counter, "gnnaas_admission_total", r)
        self.batch_predicted = _metric(
            Histogram, "gnnaas_batch_predicted_seconds", r, buckets=_LATENCY_BUCKETS_S
        )
        self.batch_measured = _metric(
            Histogram, "gnnaas_batch_measured_seconds", r, buckets=_LATENCY_BUCKETS_S
        )
        self.loop_lag = _metric(
            Histogram, "gnnaas_event_loop_lag_seconds", r, buckets=_LATENCY_BUCKETS_S
        )
        self.reloads = _metric(Counter, "gnnaas_reloads_total", r)
        for outcome in ("ok", "failed"):  # both series exist from the start, at 0
            self.reloads.labels(outcome)
        self.generation = _metric(
            Gauge, "gnnaas_registry_generation", r, multiprocess_mode="livemax"
        )
        self._queue_source: Callable[[], Iterable[QueueDepth]] = tuple
        self._limit_source: Callable[[], Iterable[tuple[str, str, float]]] = tuple
        self._served: dict[tuple[str, str], tuple[Any, ...]] = {}
        # Counter children by (counter, labels): a refusal is counted twice on the request path,
        # and each labels() call is a measurable part of a refusal's CPU, what shedding load
        # costs (benchmarks/results/shed-cost.md measures a refusal against a served answer).
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}
        self._drift: dict[tuple[str, str], DriftRecord] = {}

        self.multiprocess = multiprocess_dir() is not None
        self._published: set[tuple[str, str]] = set()
        if not self.multiprocess:
            r.register(_QueueCollector(lambda: self._queue_source()))
            r.register(_LimitCollector(lambda: self._limit_source()))
            r.register(_DriftCollector(self._drift))
            return
        self._limits = _metric(Gauge, "gnnaas_priority_rate_limit", r, multiprocess_mode="liveall")
        self._queued = _metric(Gauge, "gnnaas_queue_depth_nodes", r, multiprocess_mode="livesum")
        self._running = _metric(Gauge, "gnnaas_in_flight_nodes", r, multiprocess_mode="livesum")
        self._error = _metric(Gauge, "gnnaas_batch_time_rel_error", r, multiprocess_mode="liveall")
        self._samples = _metric(Gauge, "gnnaas_batch_time_samples", r, multiprocess_mode="liveall")

    def bind_queues(self, source: Callable[[], Iterable[QueueDepth]]) -> None:
        """Sets where ``gnnaas_queue_depth_nodes`` and ``gnnaas_in_flight_nodes`` are read."""
        self._queue_source = source

    def bind_limits(self, source: Callable[[], Iterable[tuple[str, str, float]]]) -> None:
        """Sets where ``gnnaas_priority_rate_limit`` is read: ``(dataset, priority, limit)``."""
        self._limit_source = source

    def served(
        self,
        dataset: str,
        variant: str,
        num_nodes: int,
        *,
        queue_s: float,
        sample_s: float,
        gather_s: float,
        compute_s: float,
        total_s: float,
    ) -> None:
        """Records one answered request."""
        key = (dataset, variant)
        children = self._served.get(key)
        if children is None:  # labelled children are looked up once per variant
            h = self.stage_seconds
            children = self._served[key] = (
                self.requests.labels(dataset, variant),
                self.nodes.labels(dataset, variant),
                *(h.labels(dataset, variant, s) for s in _STAGES),
            )
        requests, nodes, queue, sample, gather, compute, total = children
        requests.inc()
        nodes.inc(num_nodes)
        queue.observe(queue_s)
        sample.observe(sample_s)
        gather.observe(gather_s)
        compute.observe(compute_s)
        total.observe(total_s)

    def batch(self, dataset: str, variant: str, num_nodes: int, *, failed: bool) -> None:
        """Records one executed batch."""
        self.batches.labels(dataset, variant).inc()
        self.batch_nodes.labels(dataset, variant).observe(num_nodes)
        if failed:
            self.batch_errors.labels(dataset, variant).inc()

    def track_drift(self, dataset: str, variant: str, record: DriftRecord) -> None:
        """Publishes ``record``'s summary as ``gnnaas_batch_time_rel_error`` at scrape time."""
        self._drift[(dataset, variant)] = record

    def untrack_drift(self, dataset: str, variant: str) -> None:
        """Stops publishing the drift of a variant that is no longer served."""
        self._drift.pop((dataset, variant), None)

    def reloaded(self, outcome: str) -> None:
        """Records one reload, ``ok`` or ``failed`` (the router sets the generation gauge)."""
        self.reloads.labels(outcome).inc()

    def batch_time(
        self, dataset: str, variant: str, *, predicted_s: float, measured_s: float
    ) -> None:
        """Records one batch's predicted (profiled curve) and measured time."""
        self.batch_predicted.labels(dataset, variant).observe(predicted_s)
        self.batch_measured.labels(dataset, variant).observe(measured_s)

    def admitted(self, dataset: str, priority: str, outcome: str) -> None:
        """Records one predict request's admission ``outcome``: ``admitted`` (answered),
        ``shed_deadline``, ``shed_queue_full``, ``shed_evicted``, ``unmeetable`` (a deadline no
        admissible variant meets even alone), ``expired`` (never computed) or ``late``
        (computed, but ready after its deadline: discarded)."""
        self._child(self.admission, dataset, priority, outcome).inc()

    def rejected(self, reason: str) -> None:
        """Records one rejected request, by reason.

        Reasons used by the app: ``overloaded``, ``too_many_nodes``, ``body_too_large``,
        ``bad_header``, ``bad_value``, ``invalid_body``, ``invalid_nodes``, ``not_found``,
        ``admin_disabled``, ``unauthorized``, ``expired`` (a deadline passed in the queue),
        ``deadline_unmeetable`` (a deadline no admissible variant meets even alone).
        """
        self._child(self.rejections, reason).inc()

    def _child(self, counter: Any, *labels: str) -> Any:
        """``counter.labels(*labels)``, looked up once."""
        key = (counter, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = counter.labels(*labels)
        return child

    def publish(self) -> None:
        """Multiprocess mode: writes this worker's queue and drift figures where the other
        workers' scrapes read them (a no-op in a single process, where they are read live)."""
        if not self.multiprocess:
            return
        seen = set()
        for q in self._queue_source():
            key = (q.dataset, q.variant)
            self._queued.labels(*key).set(q.queued_nodes)
            self._running.labels(*key).set(q.in_flight_nodes)
            seen.add(key)
        for key in self._published - seen:  # variants retired by a reload carry no load
            self._queued.labels(*key).set(0)
            self._running.labels(*key).set(0)
        self._published = seen
        for dataset, priority, limit in self._limit_source():
            self._limits.labels(dataset, priority).set(limit)
        for (dataset, variant), record in list(self._drift.items()):
            summary = record.summary()
            self._samples.labels(dataset, variant).set(summary["count"])
            if summary["count"]:
                for stat, field in _DRIFT_STATS:
                    self._error.labels(dataset, variant, stat).set(summary[field])

    def retire(self) -> None:
        """Multiprocess mode: this worker is exiting; its live gauges leave the sums."""
        if self.multiprocess:
            multiprocess.mark_process_dead(os.getpid())

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric (of every worker in multiprocess
        mode)."""
        if not self.multiprocess:
            return generate_latest(self.registry)
        self.publish()
        merged = CollectorRegistry()
        multiprocess.MultiProcessCollector(merged)
        return generate_latest(merged)
