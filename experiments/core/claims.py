"""How docs/RESULTS.md states a claim, and how its prose is written in the code.

:func:`claim` and :func:`flat_claim` turn a paired difference and its Student-t interval
(`experiments.core.tables.paired_difference`) into one sentence that says whether the interval
supports the claim; :func:`flow` lets the prose of each experiment's report section be wrapped
in the source and still come out one line per paragraph.
"""

from __future__ import annotations

import math

from experiments.core.tables import excludes_zero, verdict

__all__ = ["claim", "flat_claim", "flow"]


def flow(text: str) -> str:
    """Join the wrapped lines of each paragraph and list item; keep code blocks as they are."""
    out: list[str] = []
    fenced = False
    for line in text.strip("\n").splitlines():
        starts_block = not out or not line or not out[-1] or line.startswith(("- ", "|", "```"))
        if fenced or starts_block:
            out.append(line)
        else:
            out[-1] += " " + line
        if line.startswith("```"):
            fenced = not fenced
    return "\n".join(out)


def claim(text: str, mean: float, half: float, n: int, *, expect: int = 1,
          digits: int = 3) -> str:
    """One claim with the interval of its paired difference, and whether that supports it.

    ``expect`` is the sign the claim predicts (+1: the difference is positive).
    """
    if n < 2 or math.isnan(half):
        return f"{text}: {verdict(mean, half, n, digits)}; no interval, so not claimed."
    if excludes_zero(mean, half, n) and mean * expect > 0:
        status = "supported (the 95 % interval excludes 0)"
    elif excludes_zero(mean, half, n):
        status = "**contradicted** (the 95 % interval is on the other side of 0)"
    else:
        status = "**not supported** (the 95 % interval contains 0): withdrawn"
    return f"{text}: {verdict(mean, half, n, digits)}; {status}."


def flat_claim(text: str, mean: float, half: float, n: int, tolerance: float = 0.02) -> str:
    """State a claim of no effect: supported when the interval lies within ± ``tolerance``."""
    if n < 2 or math.isnan(half):
        return f"{text}: {verdict(mean, half, n)}; no interval, so not claimed."
    if abs(mean) + half <= tolerance:
        status = f"supported (the 95 % interval lies within ±{tolerance:g})"
    elif not excludes_zero(mean, half, n):
        status = (f"consistent (the interval contains 0) but not shown: it reaches beyond "
                  f"±{tolerance:g}")
    else:
        status = "**contradicted** (the 95 % interval excludes 0)"
    return f"{text}: {verdict(mean, half, n)}; {status}."
