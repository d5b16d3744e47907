"""Triton Python model: strings -> BERT token ids for the MiniLM encoder.

``tokenize`` is also what the builders use to make the encoder's parity and calibration samples, so
the encoder is verified on exactly what it receives in production. The tokenizer is the fast
(``tokenizers``) one from the model package's ``tokenizer.json``; its file ships with the entry.
Each request is padded to its own longest text and truncated at ``max_length`` tokens (256, what
sentence-transformers uses for all-MiniLM-L6-v2).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

DEFAULT_MAX_LENGTH = 256


def load_tokenizer(path: str | os.PathLike[str], max_length: int = DEFAULT_MAX_LENGTH):  # type: ignore[no-untyped-def]
    """The fast tokenizer from ``tokenizer.json``, truncating at ``max_length``, padding to the longest."""
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


def decode_texts(raw: np.ndarray) -> list[str]:
    """Triton BYTES elements -> str; invalid UTF-8 is replaced rather than failing the batch."""
    return [bytes(item).decode("utf-8", errors="replace") if isinstance(item, bytes | bytearray | np.bytes_)
            else str(item) for item in raw.reshape(-1)]


class TritonPythonModel:
    """Each request carries [n, 1] strings and gets [n, longest] ids back."""

    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils

        self.pb = pb_utils
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        path = os.path.join(args["model_repository"], args["model_version"], "tokenizer.json")
        self.tokenizer = load_tokenizer(path, int(params.get("max_length", DEFAULT_MAX_LENGTH)))
        self.outputs = [o["name"] for o in config["output"]]

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            raw = self.pb.get_input_tensor_by_name(request, "TEXT").as_numpy()
            if raw.size == 0:
                responses.append(self.pb.InferenceResponse(
                    error=self.pb.TritonError("TEXT is an empty batch", self.pb.TritonError.INVALID_ARG)))
                continue
            encoded = tokenize(self.tokenizer, decode_texts(raw))
            responses.append(self.pb.InferenceResponse([self.pb.Tensor(n, encoded[n]) for n in self.outputs]))
        return responses
