"""What makes a build what it is, as one hash: the input hash of a spec's entry.

Every flavour's entry derives its hash from :func:`inputs_hash` (the ONNX entry is it; its precision
variants, engines and the TorchScript entry add what makes them), so a change to a family's source,
its spec, its weights or the tool versions makes every entry built from it stale.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from google.protobuf import text_format

from builders.report import file_sha256, package_versions
from builders.spec import AssetSpec, Spec
from serving.limits import DEFAULT_LIMITS

__all__ = ["inputs_hash"]


def inputs_hash(
    spec: Spec,
    requirements: Mapping[str, str] | None = None,
    *,
    gpu: bool = False,
    native_backends: bool = False,
) -> str:
    """Hash of everything that makes this build what it is.

    Args:
        requirements: the input hashes of the entries ``spec`` requires (an ensemble's steps), so an
            ensemble is rebuilt when one of its steps is (its preprocessing changed, say).
        gpu: the repository is for a GPU host (its ONNX entries are served differently).
        native_backends: the repository is for Triton's native backends (no ragged inputs).
    """
    digest = hashlib.sha256()
    for path in sorted(spec.source_files()):
        digest.update(path.name.encode())
        digest.update(file_sha256(path).encode())
    if isinstance(spec, AssetSpec):
        digest.update(text_format.MessageToString(spec.config).encode())
        if spec.produce is not None:  # made by code that may change with the tools' versions
            digest.update(_versions_key().encode())
        for name in spec.requires:
            digest.update(f"{name}={(requirements or {}).get(name, '')}".encode())
    else:
        described = {
            "inputs": spec.inputs,
            "outputs": spec.outputs,
            "batching": spec.batching,
            "tolerance": spec.tolerance,
            "opset": spec.opset,
            "parameters": spec.model_parameters(),
            "weights": str(getattr(spec, "weights", "")),
            **({"host": "gpu"} if gpu else {}),
            **(
                {"ragged": spec.ragged_inputs} if spec.ragged_inputs and not native_backends else {}
            ),
            # the published config carries the queue policies: a change to them is a new build
            "queue": DEFAULT_LIMITS.queue,
        }
        digest.update(repr(described).encode())
        digest.update(_versions_key().encode())
    return digest.hexdigest()


def _versions_key() -> str:
    versions = package_versions()
    versions.pop("platform", None)
    return json.dumps(versions, sort_keys=True)
