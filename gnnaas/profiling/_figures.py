"""What the report's plots share: the figure factory, PNG writing, colours, markers and labels.

matplotlib is imported inside the functions (Agg canvas, no pyplot state), so importing the plot
modules does not need it.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gnnaas.utils import atomic_write_bytes

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "ARCH_MARKERS",
    "DPI",
    "MAX_WIDTH_IN",
    "arch_handles",
    "figure",
    "plain_log_axis",
    "prune_color",
    "prune_handles",
    "save_png",
    "short_label",
]

DPI = 120
MAX_WIDTH_IN = 13.0
"""The widest figure, in inches: 1560 px at :data:`DPI`, which a page shows without shrinking
its 8-point labels out of reading."""
ARCH_MARKERS = {"sage": "o", "gin": "s"}
_PRUNE_COLORS = {1: "#1b9e77", 2: "#d95f02", 4: "#7570b3", 8: "#e7298a"}


def figure(width: float, height: float, nrows: int = 1, ncols: int = 1, **kw: Any) -> Any:
    """``(fig, axes)``: a constrained-layout figure of ``width`` × ``height`` inches, axes 2-D."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def save_png(fig: Figure, path: Path) -> Path:
    """Writes ``fig`` to ``path`` as a PNG, atomically."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    atomic_write_bytes(path, buf.getvalue())
    return path


def plain_log_axis(axis: Any, subs: tuple[float, ...] = (1.0, 2.0, 5.0)) -> None:
    """Log-scale ticks at ``subs`` × 10^k written as plain numbers (no 2×10⁰)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def prune_color(prune: int) -> str:
    """The colour of a prune factor (grey for one without its own)."""
    return _PRUNE_COLORS.get(int(prune), "#666666")


def prune_handles(prunes: Iterable[int]) -> list[Any]:
    """Legend entries for the prune factors present."""
    from matplotlib.lines import Line2D

    return [
        Line2D([], [], marker="o", ls="", color=prune_color(k), label=f"{int(k)}x")
        for k in sorted({int(p) for p in prunes})
    ]


def arch_handles(archs: Iterable[str]) -> list[Any]:
    """Legend entries for the architectures present."""
    from matplotlib.lines import Line2D

    present = set(archs)
    return [
        Line2D([], [], marker=m, ls="", color="gray", label=a.upper())
        for a, m in ARCH_MARKERS.items()
        if a in present
    ]


def short_label(variant_id: str, arch: str) -> str:
    """The variant id without its architecture (``greedy-4x-h128-int8``), for a panel of one
    architecture."""
    prefix = f"{arch}-"
    return variant_id[len(prefix) :] if variant_id.startswith(prefix) else variant_id
