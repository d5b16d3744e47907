"""Builds reused across repositories by their inputs' hash (builders/build_cache.py)."""

from __future__ import annotations

import os
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from builders import repository as repo
from builders.build_cache import KEEP_PER_SPEC, BuildCache
from builders.pipeline import BuildOptions, build
from builders.report import BuildReport


def _publish(
    repository: Path, name: str, digest: str, payload: bytes, tmp_path: Path
) -> BuildReport:
    source = tmp_path / f"{name}-{digest}.bin"
    source.write_bytes(payload)
    (tmp_path / "vocab").mkdir(exist_ok=True)
    (tmp_path / "vocab" / "v.txt").write_text(name)
    report = BuildReport(
        model=name,
        family="test",
        version=(repo.latest_version(repository, name) or 0) + 1,
        inputs_hash=digest,
    )
    repo.publish(
        repository,
        mc.ModelConfig(name=name, backend="python", max_batch_size=4),
        {"model.bin": source, "tokenizer/v.txt": tmp_path / "vocab" / "v.txt"},
        report,
    )
    return report


def _files(entry: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(entry)): p.read_bytes()
        for p in sorted(entry.rglob("*"))
        if p.is_file() and p.name != "build_report.json"
    }


def test_a_fresh_repository_gets_the_kept_entries_and_variants_only_when_asked(
    tmp_path: Path,
) -> None:
    first, cache = tmp_path / "first" / "model_repository", BuildCache(tmp_path / "cache")
    step = [
        _publish(first, "m", "h1", b"weights", tmp_path),
        _publish(first, "m_fp16", "h1-fp16", b"half", tmp_path),
    ]
    cache.store(first, "m", "h1", step)

    lean = tmp_path / "lean"
    assert cache.restore(lean, "m", "h1", variants=False) == ["m"]
    assert not (lean / "m_fp16").exists()
    fresh = tmp_path / "fresh"
    assert cache.restore(fresh, "m", "h1", variants=True) == ["m", "m_fp16"]
    for name in ("m", "m_fp16"):
        assert _files(fresh / name / "1") == _files(first / name / "1")
        restored = repo.latest_report(fresh, name)
        assert (
            restored is not None
            and restored.inputs_hash == step[0 if name == "m" else 1].inputs_hash
        )
        assert "restored from the build cache" in " ".join(restored.notes)
    assert (
        cache.restore(fresh, "m", "h1", variants=True) == []
    )  # already there: nothing published twice
    assert (
        cache.restore(fresh, "m", "other-hash", variants=True) == []
    )  # other inputs: a real build


def test_a_restored_entry_is_the_next_version_of_an_older_one(tmp_path: Path) -> None:
    cache = BuildCache(tmp_path / "cache")
    built = tmp_path / "built"
    cache.store(built, "m", "new", [_publish(built, "m", "new", b"new weights", tmp_path)])
    served = tmp_path / "served"
    _publish(served, "m", "old", b"old weights", tmp_path)
    assert cache.restore(served, "m", "new", variants=False) == ["m"]
    assert (
        repo.versions(served, "m") == [1, 2]
        and (served / "m" / "2" / "model.bin").read_bytes() == b"new weights"
    )


def test_only_the_newest_groups_of_a_spec_are_kept(tmp_path: Path) -> None:
    cache = BuildCache(tmp_path / "cache")
    source = tmp_path / "repo"
    for i in range(KEEP_PER_SPEC + 2):
        report = _publish(source, "m", f"h{i}", f"w{i}".encode(), tmp_path)
        cache.store(source, "m", f"h{i}", [report])
        os.utime(
            tmp_path / "cache" / "m" / f"h{i}", (i, i)
        )  # mtimes in build order, whatever the clock
    kept = sorted(p.name for p in (tmp_path / "cache" / "m").iterdir())
    assert len(kept) == KEEP_PER_SPEC and "h0" not in kept


def test_a_real_build_in_a_fresh_repository_reuses_the_cached_entry(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    built = build(["image_postprocess"], BuildOptions(repository=tmp_path / "a", cache=cache))
    assert [(r.model, r.skipped) for r in built] == [("image_postprocess", False)]
    again = build(["image_postprocess"], BuildOptions(repository=tmp_path / "b", cache=cache))
    assert [(r.model, r.version, r.skipped) for r in again] == [("image_postprocess", 1, True)]
    assert again[0].inputs_hash == built[0].inputs_hash
    assert _files(tmp_path / "b" / "image_postprocess" / "1") == _files(
        tmp_path / "a" / "image_postprocess" / "1"
    )
    # Without the cache (or forced) the same build runs for real.
    alone = build(["image_postprocess"], BuildOptions(repository=tmp_path / "c"))
    assert not alone[0].skipped
