"""A measured number as a table cell: formatted, or ``-`` where there is no figure."""

from __future__ import annotations

import math

from serving.console import number_cell


def test_a_figure_is_formatted_and_a_missing_one_is_a_dash() -> None:
    assert number_cell(12.345, ".1f") == "12.3"
    assert number_cell(0.125, ".1%") == "12.5%"
    assert number_cell(0.5, "+.2f") == "+0.50"
    assert number_cell(math.nan, ".1f") == "-"
    assert number_cell(None, ".2f") == "-"
