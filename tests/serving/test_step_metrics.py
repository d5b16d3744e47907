"""``StepTimes``: sums per step, handed to Triton's custom metrics at most once per interval.

A unit test of one class: ``pb_utils`` is a stand-in recording increments (the real stub's metrics
are exercised against Triton in ``tests/builders/test_image_classifier_gpu.py``).
"""

from __future__ import annotations

from serving.step_metrics import StepTimes
from tests.support.fake_clock import FakeClock


class _Metric:
    def __init__(self, labels: dict[str, str], sink: list[tuple[dict[str, str], float]]) -> None:
        self.labels, self.sink = labels, sink

    def increment(self, value: float) -> None:
        self.sink.append((self.labels, value))


class _PbUtils:
    """The part of ``triton_python_backend_utils`` that StepTimes uses."""

    def __init__(self) -> None:
        self.sent: list[tuple[dict[str, str], float]] = []
        outer = self

        class MetricFamily:
            COUNTER = "counter"

            def __init__(self, name: str, description: str, kind: str) -> None:
                self.name = name

            def Metric(self, labels: dict[str, str]) -> _Metric:  # noqa: N802 (the stub's spelling)
                return _Metric({"family": self.name, **labels}, outer.sent)

        self.MetricFamily = MetricFamily


def test_steps_are_summed_and_handed_over_once_per_interval() -> None:
    pb, clock = _PbUtils(), FakeClock()
    steps = StepTimes(pb, "pipeline", "1", ("decode", "respond"), flush_s=1.0, clock=clock)
    for _ in range(3):
        with steps.step("decode"):
            clock.now += 0.25
        steps.executed(items=4)
    assert pb.sent == []  # 0.75 s in: nothing sent yet
    with steps.step("respond"):
        clock.now += 0.5
    steps.executed(items=2)
    sent: dict[str, float] = {}
    for labels, value in pb.sent:
        assert labels["model"] == "pipeline" and labels["version"] == "1"
        sent[labels.get("step", labels["family"])] = value
    assert sent == {
        "decode": 0.75,
        "respond": 0.5,
        "python_model_executions_total": 4.0,
        "python_model_items_total": 14.0,
    }
    pb.sent.clear()
    steps.flush()  # nothing new: zero increments are not sent
    assert pb.sent == []


def test_a_failing_step_still_counts_its_time() -> None:
    pb, clock = _PbUtils(), FakeClock()
    steps = StepTimes(pb, "m", "1", ("decode",), clock=clock)
    try:
        with steps.step("decode"):
            clock.now += 0.1
            raise ValueError("bad image")
    except ValueError:
        pass
    steps.flush()
    assert [v for labels, v in pb.sent if labels.get("step") == "decode"] == [0.1]


def test_without_custom_metrics_the_model_runs_untimed() -> None:
    class Old:  # a stub from before custom metrics
        pass

    steps = StepTimes(Old(), "m", "1", ("decode",))
    assert not steps.enabled
    with steps.step("decode"):
        pass
    steps.executed(1)
    steps.flush()
