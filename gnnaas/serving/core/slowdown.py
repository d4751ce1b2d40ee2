"""How much slower than profiled the device runs now, learned from every batch it serves.

The router predicts a batch's time as its variant's profiled service curve times
:meth:`Slowdown.at` the batch's size (docs/architecture.md §6): a machine slower, busier or
otherwise set up than the one that profiled is noticed after a few batches, per batch-size bucket
and kind of batch. Each :class:`~gnnaas.serving.core.lane.Lane` folds its batches in
(:meth:`Slowdown.observe`); one object per device is shared by its lanes and generations.
"""

from __future__ import annotations

import math

__all__ = ["Slowdown"]

_BOUNDS = (0.1, 20.0)  # the machine's factor stays within these
_MAX_ERROR = 0.25  # one batch's log error against its prediction counts at most this much
_SIZE_BUCKETS = 6  # batch sizes around 1, 4, 16, 64, 256 and 1,024 nodes and more


# The size bucket of a batch of ``nodes`` nodes is _BUCKET_BY_BITS[nodes.bit_length()]: the
# nearest power of 4 (2 to 7 nodes go with 4, 8 to 31 with 16, ...), the last bucket taking every
# size from 512 on. A table, because every decision reads a bucket.
_BUCKET_BY_BITS = tuple(min(bits >> 1, _SIZE_BUCKETS - 1) for bits in range(65))


class Slowdown:
    """How much slower than profiled a device runs: observed / profiled batch time (1.0 = as
    profiled, 2.0 = twice as slow).

    :attr:`factor` is the machine's: how much slower (or faster) than profiled this device runs
    now, moved by every computed batch. :meth:`at` is the factor for one batch: :attr:`factor`
    times a *shape* learned per batch-size bucket (around the profiled sizes 1, 4, 16, 64, 256
    and 1,024 nodes: powers of 4) and kind (a computed batch, or a precomputed variant's table
    lookup). A curve timed in one regime and served in another is off by a factor that depends
    on the batch size, which one factor cannot follow (a server on more torch threads than free
    cores, serving one request at a time, runs its large batches well over their curve timed
    back to back and its small ones close to it: ``benchmarks/results/drift.md``); and a lookup
    costs Python work where a computed batch costs compute, so their ratios to the profile move
    apart. Each batch's error against its prediction, ``log(ratio / at(nodes))`` (the ratio of
    its measured time to its curve's), is clipped to a small bound, so one stalled or
    interrupted batch moves the slowdown a little where a lasting change is followed within a
    few dozen batches; a computed batch then moves :attr:`factor` by ``alpha`` and its bucket's
    shape by ``alpha / 4`` of that error (in log space: the factors track a geometric mean, the
    median of a noisy batch time more closely than its mean): a change seen in one bucket is
    taken mostly as the machine's (it moves every bucket), a lasting difference between buckets
    becomes their shapes. The computed shapes are kept at a geometric mean of 1 over the buckets
    that saw batches, so :attr:`factor` stays the machine's (what an unseen bucket is predicted
    with). A lookup moves only its own bucket's shape, by ``alpha``.

    Args:
        alpha (float): weight of the newest batch in :attr:`factor`.
    """

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self.shape_alpha = alpha / 4
        self.reset()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(factor={self.factor:.3f})"

    def reset(self, factor: float = 1.0) -> None:
        """Forgets what was measured: every batch is predicted at ``factor`` times its curve."""
        self.factor = factor
        self._shapes = ([1.0] * _SIZE_BUCKETS, [1.0] * _SIZE_BUCKETS)  # computed, lookup
        self._seen: set[int] = set()  # computed buckets that saw a batch

    def at(self, nodes: int, lookup: bool = False) -> float:
        """The factor a batch of ``nodes`` nodes is predicted with (``lookup``: a precomputed
        variant's)."""
        return self.factor * self._shapes[lookup][_BUCKET_BY_BITS[nodes.bit_length()]]

    def observe(
        self, duration_ms: float, predicted_ms: float, nodes: int = 1, lookup: bool = False
    ) -> None:
        """Folds one batch of ``nodes`` nodes that took ``duration_ms`` against a profiled
        ``predicted_ms`` (``lookup``: a precomputed variant's)."""
        if not predicted_ms > 0 or not math.isfinite(duration_ms):
            return
        b, shape = _BUCKET_BY_BITS[nodes.bit_length()], self._shapes[lookup]
        ratio = duration_ms / (predicted_ms * self.factor * shape[b])
        error = min(max(math.log(ratio), -_MAX_ERROR), _MAX_ERROR) if ratio > 0 else -_MAX_ERROR
        if lookup:
            shape[b] *= math.exp(self.alpha * error)
            return
        self.factor = min(max(self.factor * math.exp(self.alpha * error), _BOUNDS[0]), _BOUNDS[1])
        shape[b] *= math.exp(self.shape_alpha * error)
        seen = self._seen
        seen.add(b)
        mean = math.prod(shape[i] for i in seen) ** (1.0 / len(seen))
        for i in seen:  # the machine's factor is the seen buckets' geometric mean
            shape[i] /= mean
