"""The golden set of the promotion gates: the builders' held-out photographs (see ``builders.golden``).

Promotion judges a candidate on photographs no calibration has seen, the same set a precision variant is
judged on when it is built.
"""

from __future__ import annotations

from builders.golden import GoldenItem, golden_set

__all__ = ["GoldenItem", "golden_set"]
