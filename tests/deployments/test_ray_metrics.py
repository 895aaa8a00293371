"""Ray's counters take increments, the engine reports totals: the exporter sends the differences."""

from __future__ import annotations

from engine.messages import EngineStats

from deployments import ray_metrics


class FakeMetric:
    def __init__(self, name: str, description: str = "", tag_keys: tuple[str, ...] = ()):
        self.name, self.tag_keys, self.records = name, tag_keys, []

    def set_default_tags(self, tags: dict[str, str]) -> FakeMetric:
        assert set(tags) <= set(self.tag_keys)
        return self

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        self.records.append(value)

    def inc(self, value: float, tags: dict[str, str] | None = None) -> None:
        self.records.append((value, tags))


def test_counters_get_deltas_and_gauges_get_values(monkeypatch):
    monkeypatch.setattr(ray_metrics, "Gauge", FakeMetric)
    monkeypatch.setattr(ray_metrics, "Counter", FakeMetric)
    exporter = ray_metrics.RayMetricsExporter("smol", "r1")
    exporter.export(
        EngineStats(num_running=2, prompt_tokens_total=10, num_requests_by_finish_reason={"stop": 1})
    )
    exporter.export(
        EngineStats(num_running=0, prompt_tokens_total=25, num_requests_by_finish_reason={"stop": 3})
    )
    exporter.export(
        EngineStats(num_running=0, prompt_tokens_total=25, num_requests_by_finish_reason={"stop": 3})
    )
    assert exporter._running.records == [2, 0, 0]
    assert exporter._counters["vllm_prompt_tokens"].records == [(10, None), (15, None)]
    assert exporter._success.records == [(1, {"finished_reason": "stop"}), (2, {"finished_reason": "stop"})]
    assert all(":" not in name for name in exporter._counters)
