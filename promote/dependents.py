"""The pipelines that call a model, and how a promotion keeps their traffic on N until the canary.

Triton ensembles call their steps with ``model_version: -1``, the newest READY version: the moment
version N+1 of a step loads beside N, every ensemble calling it (``/v1/classify``,
``/v1/embeddings``) would move to N+1, before any smoke test or canary. Triton keeps one
configuration per model, so one ensemble cannot call N for some requests and N+1 for others.
So, while a promotion runs:

1. each ensemble that calls the model is reloaded with that step pinned to N (in Triton only: its
   file in the repository keeps ``-1``), before N+1 is loaded;
2. for the canary, a copy pinned to N+1 is loaded beside it as ``<ensemble>__canary`` (not in the
   repository, so clients cannot name it), and the gateway sends it the canary share of the
   ensemble's traffic (weights ``{"<M>": 0.9, "model:<ensemble>__canary": 0.1}``);
3. when traffic shifts, the ensemble is pinned to N+1 and the copy unloaded; once N is unloaded it
   goes back to its repository configuration (``-1``, which is N+1 then).

A rollback pins the ensembles to N again. Ensembles that call an ensemble calling the model follow
the inner one, which is pinned.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from builders.triton_config import read_config
from promote.triton_control import TritonControl
from serving.model_card import internal_parameters

__all__ = ["CANARY_SUFFIX", "Dependent", "find_dependents"]

#: the canary copy of an ensemble is named ``<ensemble>__canary``
CANARY_SUFFIX = "__canary"
# An ensemble's version folder is empty; Triton still wants one in a model loaded from files.
_PLACEHOLDER = {
    "file:1/README": b"canary copy of an ensemble, loaded by a promotion; not in the repository\n"
}


@dataclass(frozen=True)
class Dependent:
    """An ensemble of the served repository that calls the promoted model, as Triton serves it.

    Attributes:
        config: its configuration in the repository.
        version: the version of it Triton serves (what the canary weights keep most traffic on).
    """

    config: mc.ModelConfig
    version: int

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def canary_name(self) -> str:
        return self.name + CANARY_SUFFIX

    def pinned(self, model: str, version: int) -> mc.ModelConfig:
        """Its configuration with every step calling ``model`` pinned to ``version``."""
        config = mc.ModelConfig()
        config.CopyFrom(self.config)
        for step in config.ensemble_scheduling.step:
            if step.model_name == model:
                step.model_version = version
        return config

    def canary(self, model: str, version: int) -> tuple[mc.ModelConfig, dict[str, bytes]]:
        """The canary copy pinned to ``version``, and the files to load it from."""
        config = self.pinned(model, version)
        config.name = self.canary_name
        config.ClearField("version_policy")  # the copy has version 1 only
        for key, value in internal_parameters().items():  # a pipeline step: never listed to clients
            config.parameters[key].string_value = value
        return config, dict(_PLACEHOLDER)


def _calls(config: mc.ModelConfig, model: str) -> bool:
    return config.platform == "ensemble" and any(
        s.model_name == model for s in config.ensemble_scheduling.step
    )


def find_dependents(repository: Path, model: str, triton: TritonControl) -> list[Dependent]:
    """The ensembles of ``repository`` that call ``model`` and that Triton serves, by name."""
    found = []
    for path in sorted(repository.glob("*/config.pbtxt")):
        config = read_config(path)
        if not _calls(config, model):
            continue
        served = triton.ready_versions(config.name)
        if served:
            found.append(Dependent(config, served[-1]))
    return found
