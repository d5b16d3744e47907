"""Triton Python model: strings (or token ids) -> BERT token ids for the MiniLM encoder.

The tokenization itself is ``text_tokenization.py`` (``serving/text_tokenization.py``, copied beside
this file by the build): the one definition the builders make the encoder's samples with.

A request carries either ``TEXT`` ([n, 1] strings) or ``TOKEN_IDS`` ([n, len] int64 ids of this
tokenizer's vocabulary, each row padded at its end with -1; ``token_ids.py`` refuses ids this
tokenizer never makes from text, so another tokenizer's ids are refused, not misread). ``TOKENS``
([n, 1]) counts the tokens the encoder sees per input, special tokens included: usage. Text length
limits (``max_text_bytes``, ``max_text_chars``) come from ``serving.limits``, written into the
config at build time.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from builders.python_models.per_request import PerRequest
    from serving.text_tokenization import (
        DEFAULT_MAX_LENGTH,
        decode_texts,
        encode_ids,
        load_tokenizer,
        tokenize,
    )
    from serving.token_ids import ROW_PREFIX, TokenIdCheck
else:  # Triton imports this file with its version folder, holding copies of the modules, on sys.path
    from per_request import PerRequest
    from text_tokenization import (
        DEFAULT_MAX_LENGTH,
        decode_texts,
        encode_ids,
        load_tokenizer,
        tokenize,
    )
    from token_ids import ROW_PREFIX, TokenIdCheck


class TritonPythonModel:
    """Each request carries [n, 1] strings (or [n, len] token ids) and gets [n, longest] ids back."""

    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils

        self.pb = pb_utils
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        path = os.path.join(args["model_repository"], args["model_version"], "tokenizer.json")
        self.max_length = int(params.get("max_length", DEFAULT_MAX_LENGTH))
        # The tokenizer reads a whole text before truncating it: these bound that work and memory.
        self.max_text_bytes = int(params["max_text_bytes"]) if "max_text_bytes" in params else None
        self.max_text_chars = int(params["max_text_chars"]) if "max_text_chars" in params else None
        # ValueError: the request's own fault (a text too long, an id this tokenizer never makes)
        name = args.get("model_name", "text_tokenizer")
        self.answers = PerRequest(pb_utils, name, "tokenizing", refused=(ValueError,))
        self.tokenizer = load_tokenizer(path, self.max_length)
        self.id_check = TokenIdCheck(self.tokenizer)
        self.outputs = [o["name"] for o in config["output"]]

    def _encode(self, request: Any) -> dict[str, np.ndarray]:
        text = self.pb.get_input_tensor_by_name(request, "TEXT")
        ids = self.pb.get_input_tensor_by_name(request, "TOKEN_IDS")
        if (text is None) == (ids is None):
            raise ValueError("send exactly one of TEXT and TOKEN_IDS")
        raw = (text if text is not None else ids).as_numpy()
        if raw.size == 0:
            raise ValueError(f"{'TEXT' if text is not None else 'TOKEN_IDS'} is an empty batch")
        if text is not None:
            encoded = tokenize(
                self.tokenizer, decode_texts(raw, self.max_text_bytes, self.max_text_chars)
            )
        else:
            self._check_ids(raw)
            encoded = encode_ids(self.tokenizer, raw, self.max_length)
        encoded["TOKENS"] = encoded["attention_mask"].sum(axis=1, keepdims=True).astype(np.int64)
        return encoded

    def _check_ids(self, rows: np.ndarray) -> None:
        """Refuse a row holding an id this tokenizer never makes from text (its -1 padding removed)."""
        for index, row in enumerate(np.asarray(rows, dtype=np.int64).reshape(rows.shape[0], -1)):
            negative = np.flatnonzero(row < 0)
            problem = self.id_check.problem(row[: int(negative[0])] if negative.size else row)
            if problem is not None:
                raise ValueError(f"{ROW_PREFIX.format(row=index)} {problem}")

    def execute(self, requests: list[Any]) -> list[Any]:
        return self.answers.answer(requests, self._outputs)

    def _outputs(self, request: Any) -> list[Any]:
        encoded = self._encode(request)
        return [self.pb.Tensor(n, encoded[n]) for n in self.outputs]
