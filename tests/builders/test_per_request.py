"""``builders/python_models/per_request.py``: each request of a batch answered alone."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from builders.python_models.per_request import PerRequest, RequestRefused


class _Error:
    INVALID_ARG, INTERNAL = "INVALID_ARG", "INTERNAL"

    def __init__(self, message: str, code: str) -> None:
        self.message, self.code = message, code


def _stub(logged: list[str]) -> Any:
    """The few names of ``triton_python_backend_utils`` the helper uses."""
    return SimpleNamespace(
        InferenceResponse=lambda tensors=None, error=None: SimpleNamespace(
            tensors=tensors, error=error
        ),
        TritonError=_Error,
        Logger=SimpleNamespace(log_error=logged.append),
    )


def _outputs(request: str) -> list[Any]:
    if request == "refused":
        raise RequestRefused("input 'X' is wrong")
    if request == "broken":
        raise KeyError("/secret/path\nsecond line")
    return [request.upper()]


def test_a_refusal_and_a_failure_fail_their_own_requests_only() -> None:
    logged: list[str] = []
    answers = PerRequest(_stub(logged), "m", "pooling").answer(
        ["ok", "refused", "broken", "fine"], _outputs
    )

    assert [a.tensors for a in answers] == [["OK"], None, None, ["FINE"]]
    assert (answers[1].error.code, answers[1].error.message) == (
        "INVALID_ARG",
        "input 'X' is wrong",
    )
    assert answers[2].error.code == "INTERNAL"
    assert "secret" not in answers[2].error.message
    assert answers[2].error.message.startswith("model 'm' could not process this request")
    assert logged == ["model 'm': pooling failed: KeyError: '/secret/path\\nsecond line'"]


def test_a_model_with_no_refusals_answers_every_exception_as_its_own_failure() -> None:
    answers = PerRequest(_stub([]), "m", "postprocessing", refused=()).answer(["refused"], _outputs)
    assert answers[0].error.code == "INTERNAL"
