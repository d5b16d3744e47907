"""Unit tests of overlapping loads in the residency manager (a fake Triton repository and meter).

The real-Triton behaviour (load on first request, LRU, pins, in-flight safety) is covered by
test_gateway_residency.py with one load at a time; here the loads are held open by events, so the
tests decide exactly which loads overlap.
"""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry

from gateway.backends.residency import ResidencyManager
from gateway.backends.residency_policy import ResidencyConfig, State

SIZE = 100


class FakeRepository:
    """Triton's repository extension: each load waits for its model's event."""

    def __init__(self, manager_budget: int) -> None:
        self.budget = manager_budget
        self.release: dict[str, asyncio.Event] = {}
        self.loaded: set[str] = set()
        self.loading: set[str] = set()
        self.most_at_once = 0
        self.manager: ResidencyManager | None = None
        self.charged_at_load: list[int] = []

    async def index(self) -> dict[str, dict[str, str]]:
        return {}

    async def load(self, name: str) -> None:
        assert self.manager is not None
        self.charged_at_load.append(self.manager.table.used_bytes())
        self.loading.add(name)
        self.most_at_once = max(self.most_at_once, len(self.loading))
        await self.release.setdefault(name, asyncio.Event()).wait()
        self.loading.discard(name)
        self.loaded.add(name)

    async def unload(self, name: str) -> None:
        self.loaded.discard(name)

    async def steps(self, name: str) -> tuple[str, ...]:
        return ()

    async def close(self) -> None:
        pass


class FakeMeter:
    """Triton's memory: a model takes SIZE bytes from the moment its load starts."""

    def __init__(self, repository: FakeRepository) -> None:
        self.repository = repository

    async def used_bytes(self) -> int:
        return SIZE * len(self.repository.loaded | self.repository.loading)

    async def close(self) -> None:
        pass


async def _manager(budget_models: int, concurrent: int) -> tuple[ResidencyManager, FakeRepository]:
    repository = FakeRepository(budget_models * SIZE)
    config = ResidencyConfig(
        budget_bytes=budget_models * SIZE,
        default_estimate_bytes=SIZE,
        max_concurrent_loads=concurrent,
    )
    manager = ResidencyManager(
        config,
        repository,  # type: ignore[arg-type]
        FakeMeter(repository),
        CollectorRegistry(),
    )
    repository.manager = manager
    await manager.start()
    return manager, repository


async def _until(condition: object, what: str) -> None:
    for _ in range(2000):  # bounded: the fakes answer at once, so this is a few event-loop turns
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


def test_loads_overlap_up_to_the_limit_and_each_is_charged_before_it_starts() -> None:
    async def scenario() -> None:
        manager, repository = await _manager(budget_models=3, concurrent=2)
        deadline = time.monotonic() + 30
        waits = [asyncio.create_task(manager.ensure(m, deadline)) for m in ("a", "b", "c")]
        await _until(lambda: repository.loading == {"a", "b"}, "a and b loading together")
        # The third waits for a free slot, not for a or b to finish in Triton first.
        assert "c" not in repository.loading
        assert manager.table.entries["c"].state is State.AVAILABLE
        repository.release.setdefault("a", asyncio.Event()).set()
        await _until(lambda: "c" in repository.loading, "c loading once a's slot is free")
        for name in ("b", "c"):
            repository.release.setdefault(name, asyncio.Event()).set()
        await asyncio.gather(*waits)
        assert repository.most_at_once == 2
        # Each load reached Triton with its own charge counted (a's call came after b was charged,
        # while a read the meter), and never past the budget of 3.
        assert len(repository.charged_at_load) == 3
        assert min(repository.charged_at_load) >= 2 * SIZE
        assert repository.charged_at_load[-1] == 3 * SIZE
        # a and b overlapped: neither footprint is taken from the meter; c started while b loaded.
        assert all(manager.table.entries[m].footprint_bytes is None for m in "abc")
        await manager.close()

    asyncio.run(scenario())


def test_a_load_with_the_meter_to_itself_is_measured() -> None:
    async def scenario() -> None:
        manager, repository = await _manager(budget_models=3, concurrent=2)
        repository.release["a"] = asyncio.Event()
        repository.release["a"].set()
        await manager.ensure("a", time.monotonic() + 30)
        assert manager.table.entries["a"].footprint_bytes == SIZE
        await manager.close()

    asyncio.run(scenario())


def test_overlapping_loads_evict_least_recently_used_and_stay_within_the_budget() -> None:
    async def scenario() -> None:
        manager, repository = await _manager(budget_models=2, concurrent=2)
        for name in "abcd":
            repository.release[name] = asyncio.Event()
            repository.release[name].set()
        deadline = time.monotonic() + 30
        await manager.ensure("a", deadline)
        await manager.ensure("b", deadline)
        await asyncio.gather(manager.ensure("c", deadline), manager.ensure("d", deadline))
        assert repository.loaded == {"c", "d"}
        assert max(repository.charged_at_load) <= 2 * SIZE
        assert manager.table.used_bytes() <= manager.table.budget_bytes
        await manager.close()

    asyncio.run(scenario())


def test_one_slot_keeps_loads_one_after_another() -> None:
    async def scenario() -> None:
        manager, repository = await _manager(budget_models=3, concurrent=1)
        deadline = time.monotonic() + 30
        waits = [asyncio.create_task(manager.ensure(m, deadline)) for m in ("a", "b")]
        await _until(lambda: repository.loading == {"a"}, "a loading")
        for _ in range(50):
            await asyncio.sleep(0)
        assert repository.loading == {"a"}
        repository.release.setdefault("a", asyncio.Event()).set()
        repository.release.setdefault("b", asyncio.Event()).set()
        await asyncio.gather(*waits)
        assert repository.most_at_once == 1
        assert manager.table.entries["b"].footprint_bytes == SIZE
        await manager.close()

    asyncio.run(scenario())
