"""CUDA check of the torch integration: kernels and CPU->GPU flows in stepscope's trace.

Run on a machine with an NVIDIA GPU and a CUDA build of torch:

    python bench/cuda_check.py [OUT_DIR]

It profiles a few steps of a small MLP on the GPU with activities CPU + CUDA, writes the trace,
and checks that (1) kernel and memcpy spans are present on device tracks, (2) every ``ac2g``
flow starts on a CPU launch (``cuda_runtime``/``cuda_driver`` span) and ends on a device span
(kernel/memcpy/memset), and (3) a lone flow end sits only on a runtime call that launches
nothing.  Prints a summary and exits
non-zero when a check fails (2 when there is no GPU to check on).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
LAUNCH_CATEGORIES = {"cuda_runtime", "cuda_driver"}


def main(out_dir: Path) -> int:
    """Profile on the GPU and check the merged trace; returns the exit status."""
    import torch

    import stepscope
    from stepscope.trace import read_chrome_trace

    if not torch.cuda.is_available():
        print("cuda_check: no CUDA device here; nothing checked")
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 1024)
    y = torch.randint(0, 10, (256,))
    with stepscope.profile(
        activities=[stepscope.ProfilerActivity.CPU, stepscope.ProfilerActivity.CUDA],
        schedule=stepscope.schedule(wait=1, warmup=1, active=3, repeat=1),
        step_on="optimizer",
    ) as prof:
        for _ in range(6):
            with stepscope.record_function("forward"):
                loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
            loss.backward()
            opt.step()
            opt.zero_grad()
    path = out_dir / "cuda_check.pt.trace.json"
    prof.export_chrome_trace(path)
    trace = read_chrome_trace(path)
    spans = list(trace.iter_spans())
    by_cat = Counter(s.cat for s in spans)
    print(f"trace: {path}")
    print("span categories:", dict(by_cat))
    failures = []
    device = [s for s in spans if s.cat in DEVICE_CATEGORIES]
    if not any(s.cat == "kernel" for s in device):
        failures.append("no kernel spans")
    if not any(s.cat == "gpu_memcpy" for s in device):
        failures.append("no memcpy spans (the inputs are copied to the GPU every step)")
    if any(s.cat == "gpu_user_annotation" and s.name == "forward" for s in spans):
        print("forward annotation on the GPU timeline: yes")
    else:
        failures.append("record_function('forward') did not reach the GPU timeline")
    flows: dict[int, dict[str, object]] = {}
    for f in trace.iter_flows():
        if f.cat == "ac2g":
            flows.setdefault(f.flow_id, {})[f.phase] = f
    starts = {(s.pid, s.tid, s.start_ns): s for s in spans}
    good = bad = half = 0
    for ends in flows.values():
        s_end, f_end = ends.get("s"), ends.get("f")
        if s_end is None or f_end is None:
            # kineto (torch 2.11, H200) puts lone flow ends on runtime calls that launch
            # nothing (cudaStreamIsCapturing, cudaStreamSynchronize, cudaDeviceGetAttribute):
            # fine there, wrong on a launch, a copy or a device span
            only = s_end or f_end
            bound = starts.get((only.pid, only.tid, only.ts_ns))  # type: ignore[attr-defined]
            launches = bound is not None and any(
                word in bound.name for word in ("Launch", "Memcpy", "Memset")
            )
            if bound is not None and bound.cat in LAUNCH_CATEGORIES and not launches:
                half += 1
            else:
                bad += 1
            continue
        src = starts.get((s_end.pid, s_end.tid, s_end.ts_ns))  # type: ignore[attr-defined]
        dst = starts.get((f_end.pid, f_end.tid, f_end.ts_ns))  # type: ignore[attr-defined]
        if (
            src is not None
            and src.cat in LAUNCH_CATEGORIES
            and dst is not None
            and (dst.cat in DEVICE_CATEGORIES)
        ):
            good += 1
        else:
            bad += 1
    print(f"ac2g flows: {good} launch->device, {bad} not, {half} lone ends on non-launch calls")
    if good == 0 or bad:
        failures.append(f"CPU->GPU flows: {good} good, {bad} bad")
    window = trace.metadata.get("stepscope_window", {})
    print("window:", window)
    for failure in failures:
        print("FAILED:", failure)
    print("cuda_check:", "ok" if not failures else "failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("out/cuda_check")))
