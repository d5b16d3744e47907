"""Reads of model and server information through the data plane: KServe v2 model metadata,
configuration and readiness, the server's metadata, and (for the admin credential) Triton's
repository index and statistics. Part of :class:`gateway.tasks.service.InferenceService`.

Each read of one model passes admission's first steps (name, scope, existence) and nothing more.
"""

from __future__ import annotations

from typing import Any

from gateway.backends.triton import InferenceBackend
from gateway.errors import PermissionDenied
from gateway.settings import GatewaySettings
from gateway.tenancy.admission import AdmissionControl
from gateway.tenancy.context import RequestContext
from gateway.tenancy.traffic import check_version

__all__ = ["SERVED_EXTENSIONS", "ModelReads"]

#: Triton's KServe v2 extensions a client can use through the gateway (statistics and the repository
#: index with the admin credential only). Shared memory, sequences, client-set scheduling, repository
#: control (load, unload), tracing and logging are not served.
SERVED_EXTENSIONS = frozenset(
    {"classification", "model_configuration", "binary_tensor_data", "parameters", "statistics"}
)


class ModelReads:
    """The model-information reads of :class:`gateway.tasks.service.InferenceService`, which
    provides the attributes below."""

    settings: GatewaySettings
    backend: InferenceBackend
    admission: AdmissionControl

    @property
    def _read_timeout_s(self) -> float:
        """The deadline of every read here but readiness: four health-probe deadlines."""
        return self.settings.triton_health_timeout_s * 4

    async def _known(self, ctx: RequestContext, model: str, version: str) -> tuple[str, str]:
        """Admission's first steps for a read of model information: name, scope, existence."""
        triton_model = self.admission.check_scope(ctx, model)
        await self.admission.known(model, triton_model)
        return triton_model, check_version(version) if version else ""

    async def model_metadata(
        self, ctx: RequestContext, model: str, version: str = ""
    ) -> dict[str, Any]:
        """Triton's KServe v2 metadata of ``model`` (of one ``version`` when given).

        Raises:
            PermissionDenied: out of the caller's scope. ModelNotFound: no such model or version.
        """
        model, version = await self._known(ctx, model, version)
        return await self.backend.model_metadata(
            model, timeout_s=self._read_timeout_s, version=version
        )

    async def model_config(
        self, ctx: RequestContext, model: str, version: str = ""
    ) -> dict[str, Any]:
        """Triton's configuration of ``model`` (the model configuration extension).

        Raises:
            PermissionDenied: out of the caller's scope. ModelNotFound: no such model or version.
        """
        model, version = await self._known(ctx, model, version)
        return await self.backend.model_config(
            model, timeout_s=self._read_timeout_s, version=version
        )

    async def model_ready(self, ctx: RequestContext, model: str, version: str = "") -> bool:
        """Whether ``model`` (one ``version`` of it, when given) is READY.

        Raises:
            ModelNotFound: Triton's repository has no such model.
        """
        model, version = await self._known(ctx, model, version)
        return await self.backend.model_ready(
            model, timeout_s=self.settings.triton_health_timeout_s, version=version
        )

    async def server_metadata(self, ctx: RequestContext) -> dict[str, Any]:
        """Triton's server metadata, listing only the protocol extensions the gateway serves."""
        meta = await self.backend.server_metadata(timeout_s=self._read_timeout_s)
        extensions = [e for e in meta.get("extensions", []) if e in SERVED_EXTENSIONS]
        return {
            "name": str(meta.get("name", "triton")),
            "version": str(meta.get("version", "")),
            "extensions": extensions,
        }

    async def repository_index(
        self, ctx: RequestContext, *, ready_only: bool = False
    ) -> list[dict[str, Any]]:
        """Triton's model repository index (every model, its version, state and reason), for the admin.

        Raises:
            PermissionDenied: the caller is not the admin credential.
        """
        _require_admin(ctx, "the model repository index")
        index = await self.backend.repository_index(timeout_s=self._read_timeout_s)
        return [entry for entry in index if entry.get("state") == "READY"] if ready_only else index

    async def statistics(
        self, ctx: RequestContext, model: str = "", version: str = ""
    ) -> list[dict[str, Any]]:
        """Triton's statistics extension (cumulative counters) of every model, or of one (version).

        Raises:
            PermissionDenied: the caller is not the admin credential.
            ModelNotFound: no such model or version.
        """
        _require_admin(ctx, "Triton's inference statistics")
        if model:
            model, version = await self._known(ctx, model, version)
        return await self.backend.statistics(
            timeout_s=self._read_timeout_s, model=model, version=version
        )

    async def ready(self) -> bool:
        """Triton's own server readiness (a short, bounded probe); ``/readyz`` asks more, see
        :attr:`readiness`."""
        return await self.backend.server_ready(timeout_s=self.settings.triton_health_timeout_s)


def _require_admin(ctx: RequestContext, what: str) -> None:
    """Operator reads (Triton's own view of every model) need the admin credential, not an API key."""
    principal = ctx.principal
    if principal is None or principal.kind != "admin":
        raise PermissionDenied(
            f"{what} is for operators: send the admin credential (GATEWAY_ADMIN_TOKEN) as "
            "'Authorization: Bearer <admin token>'; an API key or JWT cannot read it",
            field="authorization",
        )
