"""The keys ``key_averages().table(sort_by=...)`` accepts, torch.profiler's names, each with
the row attribute it sorts on (the command line offers them before the profiler is loaded)."""

from __future__ import annotations

__all__ = ["SORT_KEYS"]

SORT_KEYS: dict[str, str] = {
    "cpu_time": "cpu_time",
    "cpu_time_total": "cpu_time_total",
    "self_cpu_time_total": "self_cpu_time_total",
    "count": "count",
    "cpu_memory_usage": "cpu_memory_usage",
    "self_cpu_memory_usage": "self_cpu_memory_usage",
    "flops": "flops",
}
for _device in ("cuda", "device", "xpu", "privateuse1", "mtia"):
    SORT_KEYS[f"{_device}_time"] = "device_time"
    SORT_KEYS[f"{_device}_time_total"] = "device_time_total"
    SORT_KEYS[f"self_{_device}_time_total"] = "self_device_time_total"
    SORT_KEYS[f"{_device}_memory_usage"] = "device_memory_usage"
    SORT_KEYS[f"self_{_device}_memory_usage"] = "self_device_memory_usage"
