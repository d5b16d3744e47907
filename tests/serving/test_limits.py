"""The one table of request limits is self-consistent (what the models check covers what the
gateway allows)."""

from __future__ import annotations

import pytest

from serving.limits import DEFAULT_LIMITS, QueueLimits, QueuePolicy


def test_byte_limits_cover_every_allowed_character() -> None:
    # A model checks UTF-8 bytes; the gateway checks characters. Whatever the gateway lets through
    # (up to 4 bytes per character) must pass the model's own check.
    assert DEFAULT_LIMITS.embeddings.max_text_bytes >= 4 * DEFAULT_LIMITS.embeddings.max_text_chars
    generation = DEFAULT_LIMITS.image_generation
    assert generation.max_prompt_bytes >= 4 * generation.max_prompt_chars


def test_generation_ranges_hold_their_defaults() -> None:
    g = DEFAULT_LIMITS.image_generation
    assert g.min_steps <= g.default_steps <= g.max_steps
    assert g.min_guidance <= g.default_guidance <= g.max_guidance
    assert g.side_problem("width", g.default_side) is None
    for side in (g.min_side, g.max_side):
        assert side % g.side_multiple == 0 and g.side_problem("width", side) is None
    assert g.side_problem("height", g.max_side + g.side_multiple) is not None
    assert g.side_problem("height", g.min_side + 1) is not None
    assert 0 <= g.min_seed and g.max_seed == 2**63 - 1  # INT64 on the wire


def test_embedding_requests_split_into_whole_encoder_batches() -> None:
    e = DEFAULT_LIMITS.embeddings
    assert e.max_inputs >= e.batch_size >= 1


def test_queue_limits_are_checked() -> None:
    q = DEFAULT_LIMITS.queue
    assert len(q.levels) == q.priority_levels
    assert all(
        p.max_queue_size > 0 and p.default_timeout_us > 0 and p.allow_timeout_override
        for p in q.levels
    )
    with pytest.raises(ValueError, match="priority levels"):
        QueueLimits(priority_levels=2, default_priority_level=1, levels=(QueuePolicy(8),))
    with pytest.raises(ValueError, match="default_priority_level"):
        QueueLimits(priority_levels=1, default_priority_level=2, levels=(QueuePolicy(8),))
