"""The data plane, protocol-neutral (no FastAPI, no REST models): what a request asks of the models,
each task behind admission. The routes translate HTTP and gRPC to these calls and back.

- :mod:`gateway.tasks.service`: KServe v2 inference, classification and traffic pinning
  (:class:`~gateway.tasks.service.InferenceService`).
- :mod:`gateway.tasks.model_reads`: its reads of model information (metadata, configuration,
  readiness, the repository index, statistics).
- :mod:`gateway.tasks.openai`: the OpenAI-compatible tasks (model listing, embeddings, images).
- :mod:`gateway.tasks.openai_models`: their model listing (``/v1/models``).
- :mod:`gateway.tasks.openai_inputs`: their inputs, checked (pure functions of a request and limits).
"""

from __future__ import annotations

# its modules, each imported by name: nothing is re-exported
__all__ = ["model_reads", "openai", "openai_inputs", "openai_models", "service"]
