"""Metrics of every local rank on one Prometheus endpoint (torchrun, gloo): argv OUT PORT.

Rank r counts r + 1 samples; rank 0 scrapes the shared endpoint once every rank has exported
and writes the page to OUT.
"""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path

import torch.distributed as dist

from stepscope import metrics
from stepscope.metrics.exporters.prometheus import PrometheusEndpoint


def main() -> None:
    """Count, export, scrape (rank 0)."""
    out, port = Path(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank != 0:
        dist.barrier()  # rank 0 binds the port first; the others push to it
    endpoint = metrics.add_exporter(PrometheusEndpoint(port=port))
    if rank == 0:
        dist.barrier()
    metrics.counter("samples").inc(rank + 1)
    assert metrics.flush(10.0)
    dist.barrier()
    if rank == 0:
        with urllib.request.urlopen(endpoint.url, timeout=10) as reply:
            out.write_bytes(reply.read())
    dist.barrier()
    metrics.shutdown(5.0)
    dist.destroy_process_group()
    os._exit(0)  # skip the interpreter's teardown (see ranks_job.py)


if __name__ == "__main__":
    main()
