"""Text -> BERT token ids for the MiniLM encoder, defined once.

Used by the Triton Python model ``text_tokenizer`` (the build copies this file beside its ``model.py``
and hashes it) and by the builders, which make the encoder's parity and calibration samples with it,
so the encoder is verified on exactly what it receives in production. The tokenizer is the fast
(``tokenizers``) one from the model package's ``tokenizer.json``. Each request is padded to its own
longest text and truncated at ``max_length`` tokens (256, what sentence-transformers uses for
all-MiniLM-L6-v2). Token rows (``TOKEN_IDS``: ids of this vocabulary, each row padded at its end with
-1) get ``[CLS]`` and ``[SEP]`` where they are missing and are truncated like text, so the ids of
``tokenizer.encode(text)`` (with or without special tokens) embed exactly as ``text`` does.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["DEFAULT_MAX_LENGTH", "decode_texts", "encode_ids", "load_tokenizer", "tokenize"]

DEFAULT_MAX_LENGTH = 256


def load_tokenizer(  # type: ignore[no-untyped-def]
    path: str | os.PathLike[str], max_length: int = DEFAULT_MAX_LENGTH
):
    """The fast tokenizer from ``tokenizer.json``, truncating at ``max_length``, padding to the
    longest."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    # The shipped file pads every text to a fixed 128; we pad a batch to its longest instead.
    tokenizer.enable_truncation(max_length=max_length)
    pad_id = tokenizer.token_to_id("[PAD]")
    tokenizer.enable_padding(pad_id=0 if pad_id is None else pad_id, pad_token="[PAD]")
    return tokenizer


def tokenize(tokenizer: Any, texts: Sequence[str]) -> dict[str, np.ndarray]:
    """Token ids, attention mask and token type ids, each int64 [len(texts), longest]."""
    encodings = tokenizer.encode_batch(list(texts))
    return {
        "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
        "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
    }


def encode_ids(tokenizer: Any, rows: np.ndarray, max_length: int) -> dict[str, np.ndarray]:
    """Like :func:`tokenize`, for rows of token ids padded with -1 (see the module docstring).

    Raises:
        ValueError: a row is empty, has an id outside the vocabulary, or ids after its padding.
    """
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    pad_id = tokenizer.token_to_id("[PAD]") or 0
    vocab = tokenizer.get_vocab_size()
    sequences = []
    for index, row in enumerate(np.asarray(rows, dtype=np.int64).reshape(rows.shape[0], -1)):
        negative = np.flatnonzero(row < 0)
        end = int(negative[0]) if negative.size else row.size
        if negative.size and (row[end:] >= 0).any():
            raise ValueError(f"TOKEN_IDS row {index} has ids after its -1 padding")
        ids = row[:end]
        if ids.size == 0:
            raise ValueError(f"TOKEN_IDS row {index} is empty")
        if int(ids.max()) >= vocab:
            raise ValueError(
                f"TOKEN_IDS row {index} holds id {int(ids.max())}, outside the vocabulary (0..{vocab - 1})"
            )
        body = ids[1:] if ids[0] == cls_id else ids
        body = body[:-1] if body.size and body[-1] == sep_id else body
        sequences.append([cls_id, *body[: max_length - 2].tolist(), sep_id])
    longest = max(len(s) for s in sequences)
    input_ids = np.full((len(sequences), longest), pad_id, dtype=np.int64)
    attention = np.zeros((len(sequences), longest), dtype=np.int64)
    for index, sequence in enumerate(sequences):
        input_ids[index, : len(sequence)] = sequence
        attention[index, : len(sequence)] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "token_type_ids": np.zeros_like(input_ids),
    }


def decode_texts(
    raw: np.ndarray, max_bytes: int | None = None, max_chars: int | None = None
) -> list[str]:
    """Triton BYTES elements -> str; invalid UTF-8 is replaced rather than failing the batch.

    Raises:
        ValueError: a text is longer than ``max_bytes`` (checked before decoding) or ``max_chars``.
    """
    texts = []
    for index, item in enumerate(raw.reshape(-1)):
        data = (
            bytes(item) if isinstance(item, bytes | bytearray | np.bytes_) else str(item).encode()
        )
        if max_bytes is not None and len(data) > max_bytes:
            raise ValueError(f"TEXT {index} is {len(data)} bytes; at most {max_bytes} are accepted")
        text = data.decode("utf-8", errors="replace")
        if max_chars is not None and len(text) > max_chars:
            raise ValueError(
                f"TEXT {index} is {len(text)} characters; at most {max_chars} are accepted"
            )
        texts.append(text)
    return texts
