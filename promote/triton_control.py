"""Triton's model-control API, as promotion uses it: load versions side by side, load from files."""

from __future__ import annotations

import json
from pathlib import Path

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from builders.triton_config import read_config
from serving.triton_clients import triton_client

__all__ = ["TritonControl"]


class TritonControl:
    """Explicit model control on one Triton server (HTTP ``host:port``)."""

    def __init__(self, url: str) -> None:
        self.client = triton_client(url, network_timeout=300, connection_timeout=10)

    def _load(
        self, name: str, config: mc.ModelConfig, files: dict[str, bytes] | None = None
    ) -> None:
        payload = json.dumps(json_format.MessageToDict(config, preserving_proto_field_name=True))
        self.client.load_model(name, config=payload, files=files)

    def load_config(self, config: mc.ModelConfig) -> None:
        """(Re)load ``config.name`` from its repository files with this configuration (a loaded model
        keeps serving until the new one is READY)."""
        self._load(config.name, config)

    def load_files(self, config: mc.ModelConfig, files: dict[str, bytes]) -> None:
        """Load a model that is not in the repository: ``files`` as ``file:<version>/<path>`` -> content."""
        self._load(config.name, config, files)

    def is_ready(self, name: str, version: str = "") -> bool:
        return bool(self.client.is_model_ready(name, version))

    def serve_versions(self, repository: Path, name: str, versions: list[int]) -> None:
        """(Re)load ``name`` serving exactly ``versions``; versions already loaded keep serving."""
        config = read_config(repository / name / "config.pbtxt")
        config.version_policy.CopyFrom(
            mc.ModelVersionPolicy(specific=mc.ModelVersionPolicy.Specific(versions=versions))
        )
        self._load(name, config)

    def load_candidate(self, candidate_entry: Path, version: int, as_name: str) -> None:
        """Load a candidate entry that is not in the served repository, under a temporary name."""
        config = read_config(candidate_entry / "config.pbtxt")
        config.name = as_name
        config.version_policy.CopyFrom(
            mc.ModelVersionPolicy(latest=mc.ModelVersionPolicy.Latest(num_versions=1))
        )
        files = {
            f"file:1/{path.relative_to(candidate_entry / str(version))}": path.read_bytes()
            for path in (candidate_entry / str(version)).rglob("*")
            if path.is_file()
        }
        self._load(as_name, config, files)

    def unload(self, name: str) -> None:
        self.client.unload_model(name)

    def ready_versions(self, name: str) -> list[int]:
        index = self.client.get_model_repository_index()
        return sorted(
            int(m["version"])
            for m in index
            if m["name"] == name and m.get("state") == "READY" and m.get("version")
        )
