"""Triton Python model: prompt -> image, Stable Diffusion with concurrent requests batched in the UNet.

    requests (Triton's dynamic batcher hands several to execute())
        -> parse and check each (INVALID_ARG naming the field; a bad request fails alone)
        -> cohorts: rows of the same HEIGHT x WIDTH, in arrival order, one after the other
        -> each cohort one denoising loop (diffusion_loop.generate): one UNet call per step for all
           its rows, lanes of different schedulers / step counts side by side
        -> each request is answered as soon as its images are decoded (response sender)

The networks run where the config's ``runtime`` parameter says (diffusion_networks):
``torch`` (the entry holds the weights; text encoder, UNet and VAE run in this process on the
instance's GPU, FP16) or ``triton`` (the ONNX entries named in ``text_encoder_model``, ``unet_model``
and ``vae_decoder_model``, called through BLS). Tokenizer and scheduler are the checkpoint's own,
from the version folder, through transformers' ``CLIPTokenizer`` and diffusers' scheduler classes.

Inputs, ``[n, 1]`` each (``n`` images of one size per request): PROMPT, and optional NEGATIVE_PROMPT
(""), STEPS, GUIDANCE, HEIGHT/WIDTH, SEED (random when absent) and SCHEDULER ("default": the
checkpoint's own); limits and defaults come from the config (``limit_*``, written from
``serving.limits``). Output IMAGE uint8 ``[n, HEIGHT, WIDTH, 3]``.

The helper modules are copied beside this file in the version folder, which Triton's Python stub
puts on ``sys.path``.
"""

from __future__ import annotations

import json
import os
import traceback
import typing
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.utils.dlpack
import triton_python_backend_utils as pb_utils

if TYPE_CHECKING:
    from builders.python_models.diffusion_networks import TritonNetworks
    from builders.python_models.diffusion_request import INPUTS, InvalidRequest, Request, parse_rows
    from builders.python_models.diffusion_runtime import PipelineRuntime, torch_networks
else:
    from diffusion_networks import TritonNetworks
    from diffusion_request import INPUTS, InvalidRequest, Request, parse_rows
    from diffusion_runtime import PipelineRuntime, torch_networks

#: longest exception summary written to Triton's log per failure
_LOG_CHARS = 2000


@dataclass
class _Pending:
    """A Triton request waiting for its images."""

    sender: Any
    images: list[torch.Tensor | None]


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.name = args.get("model_name", "stable_diffusion")
        here = os.path.join(args["model_repository"], args["model_version"])
        runtime = params.get("runtime", "triton")
        if runtime == "torch":
            networks: Any = torch_networks(
                here,
                params,
                gpu=args.get("model_instance_kind", "CPU").upper() == "GPU",
                device_id=int(args.get("model_instance_device_id") or 0),
            )
        else:
            networks = TritonNetworks(
                pb_utils,
                params["text_encoder_model"],
                params["unet_model"],
                params["vae_decoder_model"],
            )
        self.runtime = PipelineRuntime(here, params, networks)
        self.networks = networks
        if runtime == "torch":
            self.runtime.warm_up(int(params.get("warmup_steps", "2")))
        pb_utils.Logger.log_info(
            f"{self.name}: {runtime} runtime on {networks.device} ({networks.dtype}), schedulers "
            f"{', '.join(n or 'default' for n in self.runtime.parts.schedulers.classes)}"
        )

    def _generate(self, rows: list[tuple[Hashable, Request]], done: Any) -> None:
        timings = self.runtime.generate(rows, done)
        # Where a loop's time went, one line per loop (loadtest.diffusion_bench reads these).
        first = rows[0][1]
        pb_utils.Logger.log_info(
            f"{self.name}: loop rows={len(rows)} size={first.width}x{first.height} "
            f"unet_calls={int(timings.get('unet_calls', 0))} "
            f"prepare_ms={1000 * timings.get('prepare', 0):.1f} "
            f"denoise_ms={1000 * timings.get('denoise', 0):.1f} "
            f"decode_ms={1000 * timings.get('decode', 0):.1f}"
        )

    def _arrays(self, request: Any) -> dict[str, Any]:
        arrays = {}
        for name in INPUTS:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            arrays[name] = None if tensor is None else tensor.as_numpy()
        return arrays

    def execute(self, requests: list[Any]) -> None:
        # One line per execute: how many requests the dynamic batcher merged (tests wait on it).
        pb_utils.Logger.log_info(f"{self.name}: execute requests={len(requests)}")
        pending: dict[int, _Pending] = {}
        cohorts: dict[tuple[int, int], list[tuple[Hashable, Request]]] = {}
        for index, request in enumerate(requests):
            sender = request.get_response_sender()
            try:
                images = parse_rows(self._arrays(request), self.runtime.limits)
            except InvalidRequest as exc:
                self._fail(sender, str(exc), pb_utils.TritonError.INVALID_ARG)
                continue
            pending[index] = _Pending(sender, [None] * len(images))
            for row, parsed in enumerate(images):
                cohorts.setdefault((parsed.height, parsed.width), []).append(((index, row), parsed))
        for cohort in cohorts.values():
            self._run(cohort, pending)
        return None  # every request was answered through its response sender

    def _run(self, rows: list[tuple[Hashable, Request]], pending: dict[int, _Pending]) -> None:
        """One cohort; if its loop fails, each request of it is tried alone so only the culprit fails."""

        def done(keys: list[Hashable], images: torch.Tensor) -> None:
            for key, image in zip(keys, images, strict=True):
                index, row = typing.cast(tuple[int, int], key)
                waiting = pending[index]
                waiting.images[row] = image
                if all(i is not None for i in waiting.images):
                    stacked = torch.stack(waiting.images)  # type: ignore[arg-type]
                    out = pb_utils.Tensor.from_dlpack(
                        "IMAGE", torch.utils.dlpack.to_dlpack(stacked)
                    )
                    waiting.sender.send(
                        pb_utils.InferenceResponse(output_tensors=[out]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                    )
                    del pending[index]

        try:
            self._generate(rows, done)
            return
        except Exception as exc:  # noqa: BLE001 - the runtime's errors are of every kind; logged, not sent
            owners = sorted({key[0] for key, _ in rows if key[0] in pending})  # type: ignore[index]
            self._log_failure(exc, len(owners))
        self._release_memory()
        if len(owners) == 1:
            self._fail(
                pending.pop(owners[0]).sender, f"{self.name}: generation failed; see the server log"
            )
            return
        for owner in owners:
            if owner in pending:
                self._run([(key, r) for key, r in rows if key[0] == owner], pending)  # type: ignore[index]

    def _release_memory(self) -> None:
        if self.networks.device.type == "cuda":
            torch.cuda.empty_cache()

    def _log_failure(self, exc: Exception, requests: int) -> None:
        summary = "".join(traceback.format_exception(exc))[-_LOG_CHARS:]
        pb_utils.Logger.log_error(
            f"{self.name}: a generation of {requests} request(s) failed: {summary}"
        )

    def _fail(self, sender: Any, message: str, code: Any = None) -> None:
        error = (
            pb_utils.TritonError(message, code)
            if code is not None
            else pb_utils.TritonError(message)
        )
        sender.send(
            pb_utils.InferenceResponse(error=error),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )

    def finalize(self) -> None:
        if self.networks.device.type == "cuda":
            torch.cuda.synchronize(self.networks.device)
