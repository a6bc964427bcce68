"""What every figure of the experiments shares: a headless pyplot, axis labels and saving."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["decorate", "pyplot", "save"]


def pyplot() -> Any:
    """matplotlib.pyplot with the Agg backend (no display needed: runs on servers and CI)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def decorate(ax: Any, *, xlabel: str, ylabel: str, title: str | None = None,
             xscale: str | None = None, yscale: str | None = None,
             ylim: tuple[float, float] | None = None, legend: dict[str, Any] | None = None
             ) -> None:
    """Label one set of axes; ``legend`` holds the keyword arguments of ``ax.legend``."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title)
    if xscale is not None:
        ax.set_xscale(xscale)
    if yscale is not None:
        ax.set_yscale(yscale)
    if ylim is not None:
        ax.set_ylim(*ylim)
    if legend is not None:
        ax.legend(**legend)


def save(fig: Any, path: Path, *, suptitle: str | None = None) -> Path:
    """Lay out, write as PNG and close ``fig`` (pyplot keeps every open figure otherwise)."""
    if suptitle is not None:
        fig.suptitle(suptitle)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path
