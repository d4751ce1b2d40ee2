"""The one definition of a percentile and a median, for the package and its benchmarks.

Every latency or time percentile gnnaas computes (the profiler's p50/p95/p99, the drift record's
medians, the variant generator's probes) and every one its benchmarks report goes through
:func:`percentile` or :func:`median`, so that two figures called "p99" are the same statistic.

**Definition** (numpy's default, ``method="linear"``; Hyndman and Fan's type 7, the default of R
and of spreadsheets' ``PERCENTILE.INC``). Sort the ``n`` values as ``x[0] <= ... <= x[n-1]`` and
let ``h = (n - 1) * q / 100``. The ``q``-th percentile is

    ``x[floor(h)] + (h - floor(h)) * (x[floor(h) + 1] - x[floor(h)])``

the straight line between the two order statistics around position ``h``. So the 0th percentile
is the minimum, the 100th the maximum, and every value lies between two observed ones. The median
is the 50th percentile: the middle value of an odd count, the mean of the two middle values of an
even one (:func:`median` computes it as that mean, which equals ``percentile(values, 50)`` up to
the rounding of the last bit).

Infinite values are allowed, as the largest or smallest of all (a benchmark counts a request that
timed out as infinitely slow): a percentile whose line touches ``+inf`` is ``+inf``. numpy alone
would give NaN there (``inf - inf``). A NaN among the values makes the result NaN; callers that
mean "skip missing values" drop them first.

This module imports nothing from gnnaas, so every layer may use it.

Example:
    >>> percentile([1.0, 2.0, 3.0, 4.0], 50)
    2.5
    >>> percentile([1.0, 2.0, 3.0, 4.0], 75)  # h = 2.25: a quarter of the way from 3 to 4
    3.25
    >>> median([3.0, 1.0, 2.0])
    2.0
    >>> percentile([1.0, 2.0, float("inf")], 99)
    inf
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["median", "percentile"]


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` by linear interpolation (this module's definition).

    Args:
        values (Iterable[float]): the sample (a sequence, an array or any iterable of numbers).
        q (float): the percentile, in ``[0, 100]``.

    Returns:
        float: the percentile; ``inf`` when its interpolation touches an infinite value, NaN
        when a value is NaN.

    Raises:
        ValueError: ``values`` is empty or not one-dimensional, or ``q`` is outside
            ``[0, 100]``.

    Example:
        >>> percentile(range(1, 6), 100)
        5.0
    """
    if not 0.0 <= q <= 100.0:  # also rejects NaN
        raise ValueError(f"stats.percentile: q must be in [0, 100] (got {q})")
    arr = _as_sample(values, "percentile")
    if np.isfinite(arr).all() or np.isnan(arr).any():
        return float(np.percentile(arr, q))
    return _percentile_with_infinities(arr, q)


def median(values: Iterable[float]) -> float:
    """The median of ``values``: their 50th percentile (this module's definition).

    The middle value of an odd count, the mean of the two middle values of an even one.

    Args:
        values (Iterable[float]): the sample (a sequence, an array or any iterable of numbers).

    Returns:
        float: the median; NaN when a value is NaN.

    Raises:
        ValueError: ``values`` is empty or not one-dimensional.

    Example:
        >>> median([4.0, 1.0, 3.0, 2.0])
        2.5
    """
    arr = _as_sample(values, "median")
    with np.errstate(invalid="ignore"):  # -inf and +inf in the middle: their mean is NaN
        return float(np.median(arr))


def _as_sample(values: Iterable[float], name: str) -> np.ndarray:
    if not isinstance(values, np.ndarray | Sequence):
        values = list(values)  # a generator or another one-pass iterable
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"stats.{name}: values must be one-dimensional (got shape {arr.shape})")
    if arr.size == 0:
        raise ValueError(f"stats.{name}: values must hold at least one number (got none)")
    return arr


def _percentile_with_infinities(arr: np.ndarray, q: float) -> float:
    """numpy's interpolation ``a + t * (b - a)`` is NaN when ``a`` or ``b`` is infinite; the
    definition's value is the order statistic itself when ``h`` falls on it, else the infinite
    neighbour (NaN between ``-inf`` and ``+inf``)."""
    low = float(np.percentile(arr, q, method="lower"))  # x[floor(h)]
    high = float(np.percentile(arr, q, method="higher"))  # x[ceil(h)]
    if low == high:
        return low
    if math.isinf(low) and math.isinf(high):
        return math.nan
    if math.isinf(high):
        return high
    if math.isinf(low):
        return low
    return float(np.percentile(arr, q))
