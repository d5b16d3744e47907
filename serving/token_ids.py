"""Which token ids a client may send in place of text: ids the model's own tokenizer makes from text.

OpenAI's embeddings API takes token arrays, and clients send them: LangChain's ``OpenAIEmbeddings``
tokenizes with tiktoken (``cl100k_base`` for a model name it does not know) and sends those ids. An id
is only a number: read with another vocabulary it is another word, and the embedding is silently of
some other text. So a token array is decoded with the model's tokenizer first, and refused when it
holds an id that tokenizer never produces from text:

- an id outside the vocabulary;
- a reserved entry: padding, ``[MASK]``, the ``[unusedN]`` slots of a BERT WordPiece vocabulary (ids
  1-99 and 104-998 there, where tiktoken keeps its commonest pieces: ``.`` is 13, `` the`` 279);
- ``[CLS]`` anywhere but first, ``[SEP]`` anywhere but last.

``[UNK]`` stays allowed (text with characters outside the vocabulary produces it). What this cannot
catch is a foreign array that happens to use only ordinary pieces of this vocabulary (a single short
word): such an array is read as this vocabulary's pieces, as OpenAI reads token arrays.

Used by the Triton Python model ``text_tokenizer`` (the build copies this file beside its ``model.py``)
and by the gateway, which turns the model's ``TOKEN_IDS row N`` into the client's ``input[K]``.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

__all__ = ["ROW_PREFIX", "TokenIdCheck", "token_row_of"]

#: how every refusal of a token row starts (``serving.text_tokenization`` writes the same prefix)
ROW_PREFIX = "TOKEN_IDS row {row}"
_ROW = re.compile(r"TOKEN_IDS row (\d+)")
_UNUSED = re.compile(r"^\[unused\d+\]$")
#: special tokens text does produce (the unknown-character token) or that may open / close a row
_KEPT_SPECIAL = ("[UNK]", "[CLS]", "[SEP]")


def token_row_of(message: str) -> int | None:
    """The row a ``TOKEN_IDS row N ...`` refusal names, or ``None`` when it names none."""
    found = _ROW.search(message)
    return int(found.group(1)) if found else None


class TokenIdCheck:
    """Checks rows of token ids against one tokenizer (see the module docstring).

    Args:
        tokenizer: a ``tokenizers.Tokenizer``.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.vocab_size = int(tokenizer.get_vocab_size())
        self.cls_id = tokenizer.token_to_id("[CLS]")
        self.sep_id = tokenizer.token_to_id("[SEP]")
        added = {
            token.content
            for token in tokenizer.get_added_tokens_decoder().values()
            if token.special
        }
        reserved = {tokenizer.token_to_id(t) for t in added if t not in _KEPT_SPECIAL}
        reserved |= {
            i for t, i in tokenizer.get_vocab(with_added_tokens=False).items() if _UNUSED.match(t)
        }
        self._reserved = np.zeros(self.vocab_size, dtype=bool)
        self._reserved[[i for i in reserved if i is not None and 0 <= i < self.vocab_size]] = True
        self._tokenizer = tokenizer

    def problem(self, ids: np.ndarray) -> str | None:
        """Why the ids of one row (padding removed) are not ids this tokenizer makes from text, or
        ``None``."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        outside = np.flatnonzero((ids < 0) | (ids >= self.vocab_size))
        if outside.size:
            return (
                f"holds id {int(ids[outside[0]])}, outside the vocabulary (0..{self.vocab_size - 1}): "
                f"{self._advice()}"
            )
        reserved = np.flatnonzero(self._reserved[ids])
        if reserved.size:
            at = int(reserved[0])
            token = self._tokenizer.id_to_token(int(ids[at]))
            return (
                f"holds id {int(ids[at])} at position {at}, the reserved entry {token} that text never "
                f"produces: {self._advice()}"
            )
        for special, name, keep in (
            (self.cls_id, "[CLS]", 0),
            (self.sep_id, "[SEP]", ids.size - 1),
        ):
            misplaced = (
                [int(p) for p in np.flatnonzero(ids == special) if p != keep]
                if special is not None
                else []
            )
            if misplaced:
                where = "first" if keep == 0 else "last"
                return f"holds {name} (id {special}) at position {misplaced[0]}; it may only come {where}"
        return None

    def _advice(self) -> str:
        return (
            f"token arrays must be ids of this model's own tokenizer (vocabulary of {self.vocab_size}); "
            "send text instead (LangChain: OpenAIEmbeddings(check_embedding_ctx_length=False) sends text)"
        )
