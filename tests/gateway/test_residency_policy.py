"""Unit tests of the residency table's rules (pure bookkeeping: no Triton, no clock)."""

from __future__ import annotations

from pathlib import Path

from gateway.backends.residency_memory import parse_gpu_used
from gateway.backends.residency_policy import DISK_FACTOR, ResidencyTable, State, disk_estimate


def _table(budget: int, **sizes: int) -> ResidencyTable:
    table = ResidencyTable(budget)
    for at, (name, size) in enumerate(sizes.items()):
        entry = table.get(name, size)
        entry.state = State.LOADED
        entry.last_used = float(at)
    return table


def test_victims_are_least_recently_used_first_and_only_as_many_as_needed() -> None:
    table = _table(300, a=100, b=100, c=100)
    assert [e.name for e in table.victims(150)] == ["a", "b"]
    table.entries["a"].last_used = 10.0
    assert [e.name for e in table.victims(100)] == ["b"]
    assert table.victims(0) == []


def test_pinned_in_flight_and_held_models_are_never_victims() -> None:
    table = _table(300, a=100, b=100, c=100)
    table.entries["a"].pinned = True
    table.entries["b"].in_flight = 1
    assert [e.name for e in table.victims(100)] == ["c"]
    table.entries["c"].held_by.add("ensemble")
    assert table.victims(100) is None  # nothing can make room: nothing is chosen


def test_a_model_bigger_than_the_budget_beside_pinned_ones_does_not_fit() -> None:
    table = _table(300, a=200)
    table.entries["a"].pinned = True
    big = table.get("big", 150)
    assert not table.fits_alone(big)
    big.footprint_bytes = 100  # measured smaller than estimated
    assert table.fits_alone(big) and big.measured


def test_carried_steps_cost_nothing_and_leave_with_their_last_ensemble() -> None:
    table = _table(1000, ens_a=300, ens_b=10, step=0)
    step = table.entries["step"]
    step.carried = True
    step.held_by = {"ens_a", "ens_b"}
    table.entries["ens_a"].steps = table.entries["ens_b"].steps = ("step",)
    assert table.used_bytes() == 310
    assert table.going_with(table.entries["ens_a"]) == []  # ens_b still holds it
    step.held_by = {"ens_b"}
    assert table.going_with(table.entries["ens_b"]) == [step]
    step.in_flight = 1
    assert not table.evictable(table.entries["ens_b"])  # its step is busy


def test_estimate_is_size_on_disk_times_the_modelmesh_factor(tmp_path: Path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.onnx").write_bytes(b"x" * 1000)
    assert disk_estimate(tmp_path / "m") == int(1000 * DISK_FACTOR)
    assert disk_estimate(tmp_path / "missing") is None


def test_gpu_memory_is_the_sum_of_tritons_gauges() -> None:
    page = (
        "# HELP nv_gpu_memory_used_bytes GPU used memory, in bytes\n"
        'nv_gpu_memory_used_bytes{gpu_uuid="GPU-1"} 1.5e+09\n'
        'nv_gpu_memory_used_bytes{gpu_uuid="GPU-2"} 500000000\n'
        'nv_gpu_memory_total_bytes{gpu_uuid="GPU-1"} 8e+10\n'
    )
    assert parse_gpu_used(page) == 2_000_000_000


def test_room_that_only_requests_in_flight_hold_is_told_from_room_that_cannot_be_made() -> None:
    table = _table(200, a=100, b=100)
    table.entries["a"].in_flight = 1
    table.entries["b"].in_flight = 2
    assert table.victims(100) is None
    assert [e.name for e in table.victims(100, when_idle=True)] == [
        "a"
    ]  # wait for a's request, then evict
    table.entries["a"].pinned = table.entries["b"].pinned = True
    assert table.victims(100, when_idle=True) is None  # no wait can help


def test_a_model_loaded_for_waiting_requests_is_not_taken_before_they_start() -> None:
    table = _table(200, a=100, b=100)
    table.entries["a"].waiters = 2
    assert [e.name for e in table.victims(100)] == ["b"]
