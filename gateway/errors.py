"""The gateway's exception hierarchy. No web framework here: the app factory maps these to HTTP.

::

    GatewayError                    base; never raised itself
    ├── BadRequest                  400  the request is malformed (names the ``field``)
    │   ├── InferenceInputError     400  Triton refused the inputs (shape, dtype, undecodable image)
    │   └── CallbackRefused         400  a job's callback URL is off the allow-list or resolves to
    │                                    a refused address
    ├── AuthenticationError         401  no credential, or one that is wrong/expired/revoked
    ├── PermissionDenied            403  a valid credential without the scope for this model/route
    ├── NotFound                    404  no such thing (an API key id, a route's resource)
    │   └── ModelNotFound           404  Triton does not serve this model (yet)
    ├── Gone                        410  it existed and has expired (a signed image URL past its time)
    ├── Conflict                    409  the request contradicts stored state (an imported key id,
    │   │                                a version not READY)
    │   └── JobNotFinished          409  a job's result asked for before it succeeded; a finished
    │                                    job cancelled
    ├── PayloadTooLarge             413  the body is over the configured limit (also once decompressed)
    ├── UnsupportedMediaType        415  a Content-Encoding the gateway does not decode
    ├── RateLimited                 429  the client's bucket for this model is empty (Retry-After)
    │   └── TooManyJobs             429  the key holds as many generation jobs as it may (Retry-After)
    ├── Overloaded                  429  too many requests in flight for this model (Retry-After)
    ├── ServiceUnavailable          503  (Retry-After)
    │   ├── CapacityReserved        503  a lower tier's request would take the in-flight reserve of
    │   │                                the highest tier
    │   ├── UpstreamUnavailable     503  Triton cannot be reached or is not ready
    │   ├── ModelNotReady           503  the model exists but is loading/unloading
    │   ├── ModelUnhealthy          503  an instance of the model (or of a step it calls) died;
    │   │                                it is being reloaded
    │   ├── RateLimiterUnavailable  503  Redis is down and the policy is "closed"
    │   ├── StateStoreUnavailable   503  the shared key / canary store (Redis) cannot be reached
    │   └── ModelLoadFailed         503  loading the model on demand failed (retried after a backoff)
    ├── ModelTooLarge               507  the model's footprint exceeds the whole memory budget
    ├── UpstreamTimeout             504  Triton did not answer within the per-request timeout
    └── UpstreamError               502  Triton answered with an error we cannot attribute to the client
"""

from __future__ import annotations

__all__ = [
    "AuthenticationError",
    "BadRequest",
    "CallbackRefused",
    "CapacityReserved",
    "Conflict",
    "GatewayError",
    "Gone",
    "InferenceInputError",
    "JobNotFinished",
    "ModelNotFound",
    "ModelLoadFailed",
    "ModelNotReady",
    "ModelUnhealthy",
    "ModelTooLarge",
    "NotFound",
    "Overloaded",
    "PayloadTooLarge",
    "PermissionDenied",
    "RateLimited",
    "RateLimiterUnavailable",
    "ServiceUnavailable",
    "StateStoreUnavailable",
    "TooManyJobs",
    "UnsupportedMediaType",
    "UpstreamError",
    "UpstreamTimeout",
    "UpstreamUnavailable",
]


class GatewayError(Exception):
    """Base of every error the gateway reports to a client.

    Args:
        detail: a human-readable explanation, safe to show the client (never a secret).
        field: the request field at fault, where one is.
        headers: extra response headers (e.g. ``Retry-After``).
    """

    title = "Gateway error"

    def __init__(
        self, detail: str, *, field: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.field = field
        self.headers: dict[str, str] = dict(headers or {})


class BadRequest(GatewayError):
    title = "Bad request"


class InferenceInputError(BadRequest):
    title = "Inference input rejected"


class CallbackRefused(BadRequest):
    title = "Callback URL refused"


class AuthenticationError(GatewayError):
    title = "Authentication required"


class PermissionDenied(GatewayError):
    title = "Permission denied"


class NotFound(GatewayError):
    title = "Not found"


class Gone(GatewayError):
    """It existed and has expired (a signed image URL past its expiry)."""

    title = "Gone"


class ModelNotFound(NotFound):
    """Triton does not serve ``model``."""

    title = "Model not found"

    def __init__(self, model: str, detail: str | None = None) -> None:
        super().__init__(detail or f"model '{model}' is not served by Triton", field="model")
        self.model = model


class Conflict(GatewayError):
    title = "Conflict"


class JobNotFinished(Conflict):
    title = "Job not finished"


class PayloadTooLarge(GatewayError):
    title = "Payload too large"


class UnsupportedMediaType(GatewayError):
    title = "Unsupported media type"


class _RetryLater(GatewayError):
    """An error whose response carries ``Retry-After`` (whole seconds, at least 1)."""

    def __init__(
        self, detail: str, *, retry_after_s: float, headers: dict[str, str] | None = None
    ) -> None:
        merged = {"Retry-After": str(max(1, int(-(-retry_after_s // 1))))}
        merged.update(headers or {})
        super().__init__(detail, headers=merged)
        self.retry_after_s = retry_after_s


class RateLimited(_RetryLater):
    title = "Rate limit exceeded"


class TooManyJobs(RateLimited):
    title = "Too many jobs"


class Overloaded(_RetryLater):
    title = "Too many requests in flight"


class ServiceUnavailable(_RetryLater):
    title = "Service unavailable"


class CapacityReserved(ServiceUnavailable):
    """The in-flight capacity left is the reserve kept for the highest tier (a lower tier's request)."""

    title = "Capacity reserved"


class UpstreamUnavailable(ServiceUnavailable):
    title = "Inference server unavailable"


class ModelNotReady(ServiceUnavailable):
    title = "Model not ready"


class ModelUnhealthy(ServiceUnavailable):
    """A worker process of a model died (a Python stub killed or out of memory), or the model keeps
    failing: the gateway reloads it (:mod:`gateway.backends.model_healer`) and answers 503 meanwhile.

    Args:
        failed_model: the Triton model whose instance failed: the model called, or a step of its
            pipeline (an ensemble's tokenizer); that one is reloaded.
    """

    title = "Model unhealthy"

    def __init__(self, detail: str, *, failed_model: str, retry_after_s: float) -> None:
        super().__init__(detail, retry_after_s=retry_after_s)
        self.failed_model = failed_model


class RateLimiterUnavailable(ServiceUnavailable):
    title = "Rate limiter unavailable"


class StateStoreUnavailable(ServiceUnavailable):
    title = "Shared state store unavailable"


class ModelLoadFailed(ServiceUnavailable):
    title = "Model failed to load"


class ModelTooLarge(GatewayError):
    """The model's footprint is larger than the memory budget of a Triton instance."""

    title = "Model larger than the memory budget"


class UpstreamTimeout(GatewayError):
    title = "Inference server timed out"


class UpstreamError(GatewayError):
    title = "Inference server error"
