"""Prometheus: an HTTP endpoint serving the pipeline's snapshot, and a Pushgateway pusher.

Both render with prometheus_client's own exposition code (text or OpenMetrics, chosen from the
scraper's Accept header) over a custom collector built from the snapshot; nothing here writes
the format itself.  Rendering works in chunks of series with short pauses between them, so a
scrape never holds the GIL for long, and the result is cached until the next export.

Several processes on one host share one endpoint: the first to bind the port serves it; the
others (forked DataLoader workers, local ranks started separately) find it taken by a stepscope
endpoint and push their snapshots to it over loopback.  The endpoint merges them: counters and
histograms are summed (a process that exits keeps its final totals, folded into one retained
series, so nothing piles up), gauges are combined by their ``merge`` setting.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import http.client
import json
import os
import re
import socket
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlparse

from stepscope.extras import missing_extra
from stepscope.metrics.exporters.rank_labels import with_rank_labels

try:
    from prometheus_client.exposition import choose_encoder, delete_from_gateway, push_to_gateway
    from prometheus_client.metrics_core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
        SummaryMetricFamily,
    )
    from prometheus_client.utils import floatToGoString
except ImportError as exc:
    raise missing_extra(
        "PrometheusEndpoint and PushgatewayExporter", "prometheus", f"{exc}"
    ) from exc

from stepscope.clock import now_ns
from stepscope.metrics.cooperate import RENDER_CHUNK, pause_for_others
from stepscope.metrics.exporters.base import Exporter
from stepscope.metrics.exporters.scalar_steps import with_step_families
from stepscope.metrics.failures import LOGGER, report_failure
from stepscope.metrics.points import (
    ExpHistogramValue,
    ExportBatch,
    Family,
    HistogramValue,
    Labels,
    SeriesPoint,
    SummaryValue,
    Value,
    family_from_json,
    family_to_json,
)
from stepscope.text import clean_text

__all__ = [
    "PrometheusEndpoint",
    "PushgatewayExporter",
    "SnapshotCollector",
    "merge_processes",
    "prometheus_name",
    "prometheus_names",
    "render",
    "to_prometheus",
]

_PUSH_PATH = "/stepscope/v1/push"
_PING_PATH = "/stepscope/v1/ping"
_MAX_PUSH_BYTES = 64 << 20
_NS = 1_000_000_000
_go_float: Callable[[float], str] = floatToGoString  # prometheus_client's float formatting


def prometheus_name(name: str, namespace: str = "") -> str:
    """``name`` with characters Prometheus does not allow replaced by ``_``."""
    full = f"{namespace}_{name}" if namespace else name
    out = "".join(c if (c.isascii() and (c.isalnum() or c in "_:")) else "_" for c in full)
    return f"_{out}" if out[:1].isdigit() or not out else out


def prometheus_names(families: Sequence[Family], namespace: str = "") -> list[str]:
    """Exposition names for ``families``, distinct even when their names clean to the same one.

    Of families whose names collide (``train.loss``, ``train-loss``, ``train_loss``), the one
    already written as cleaned keeps the name (else the first by original name); the others get
    ``_`` and 8 hex digits of the CRC-32 of their original name, so a name never depends on
    registration order.
    """
    cleaned = [prometheus_name(f.name, namespace) for f in families]
    by_name: dict[str, list[int]] = {}
    for i, name in enumerate(cleaned):
        by_name.setdefault(name, []).append(i)
    taken = set(by_name)
    for name, members in by_name.items():
        if len(members) < 2:
            continue
        exact = [i for i in members if families[i].name == name]
        keep = exact[0] if exact else min(members, key=lambda i: families[i].name)
        for i in members:
            if i != keep:
                tagged = f"{name}_{zlib.crc32(clean_text(families[i].name).encode()):08x}"
                while tagged in taken:
                    tagged += "_"
                taken.add(tagged)
                cleaned[i] = tagged
    return cleaned


def _help(family: Family) -> str:
    text = family.description or family.name
    return clean_text(f"{text} (unit: {family.unit})" if family.unit else text)


def _parts(family: Family) -> Iterator[tuple[Sequence[SeriesPoint], bool]]:
    points = family.points
    for start in range(0, len(points), RENDER_CHUNK):
        yield points[start : start + RENDER_CHUNK], start > 0


def _label_names(family: Family) -> list[str]:
    return sorted({k for p in family.points for k, _ in p.labels})


def _metric(family: Family, name: str, points: Sequence[SeriesPoint], names: list[str]) -> Metric:

    def values(labels: Labels) -> list[str]:
        found = dict(labels)
        return [clean_text(found.get(n, "")) for n in names]

    doc = _help(family)
    if family.kind == "counter":
        counter = CounterMetricFamily(name, doc, labels=names)
        for p in points:
            counter.add_metric(values(p.labels), float(p.value))  # type: ignore[arg-type]
        return counter
    if family.kind in ("histogram", "exponential_histogram"):
        histogram = HistogramMetricFamily(name, doc, labels=names)
        for p in points:
            value = p.value
            if isinstance(value, (HistogramValue, ExpHistogramValue)):
                buckets = [(_go_float(b), float(n)) for b, n in value.cumulative()]
                histogram.add_metric(values(p.labels), buckets, value.sum)
        return histogram
    if family.kind == "summary":
        summary = SummaryMetricFamily(name, doc, labels=names)
        for p in points:
            value = p.value
            if isinstance(value, SummaryValue):
                summary.add_metric(values(p.labels), value.count, value.sum)
        return summary
    gauge = GaugeMetricFamily(name, doc, labels=names)
    for p in points:
        gauge.add_metric(values(p.labels), float(p.value))  # type: ignore[arg-type]
    return gauge


def to_prometheus(families: Iterable[Family], namespace: str = "") -> Iterator[tuple[Metric, bool]]:
    """prometheus_client metric families, at most ``RENDER_CHUNK`` series each.

    The flag says the metric continues the previous one (a family split into parts).
    """
    families = list(families)
    for family, name in zip(families, prometheus_names(families, namespace), strict=True):
        names = _label_names(family)
        for points, continuation in _parts(family):
            try:
                metric = _metric(family, name, points, names)
            except Exception as exc:  # one family must not fail the whole scrape
                report_failure("render_error", f"prometheus family {name!r}", exc)
                break
            yield metric, continuation


class SnapshotCollector:
    """A prometheus_client collector over fixed metric families."""

    def __init__(self, metrics: Iterable[Metric]) -> None:
        self._metrics = list(metrics)

    def collect(self) -> Iterable[Metric]:
        """The families."""
        return self._metrics


class _PausingCollector:
    """Yields families one by one, pausing for other threads between them."""

    def __init__(self, families: Sequence[Family], namespace: str) -> None:
        self._families = families
        self._namespace = namespace

    def collect(self) -> Iterator[Metric]:
        names = prometheus_names(self._families, self._namespace)
        for i, (family, name) in enumerate(zip(self._families, names, strict=True)):
            if i:
                pause_for_others()
            yield _metric(family, name, family.points, _label_names(family))


def _strip_header(text: bytes) -> bytes:
    while text.startswith(b"# "):
        end = text.find(b"\n")
        text = b"" if end < 0 else text[end + 1 :]
    return text


def _encode(encoder: Callable[[Any], bytes], group: list[Metric]) -> bytes:
    """The group's exposition; a metric that cannot be rendered is left out and counted."""
    with contextlib.suppress(Exception):
        return encoder(SnapshotCollector(group))
    eof = b"# EOF\n"
    parts = []
    for metric in group:
        try:
            parts.append(encoder(SnapshotCollector([metric])).removesuffix(eof))
        except Exception as exc:
            report_failure("render_error", f"prometheus family {metric.name!r}", exc)
    return b"".join(parts) + (eof if parts and group and _is_openmetrics(encoder) else b"")


def _is_openmetrics(encoder: Callable[[Any], bytes]) -> bool:
    return encoder is not choose_encoder("")[0]


def render(families: Sequence[Family], accept: str = "", namespace: str = "") -> tuple[bytes, str]:
    """Exposition bytes and content type for ``accept`` (text 0.0.4 or OpenMetrics).

    Works in chunks of at most ``RENDER_CHUNK`` series and pauses between chunks.
    """
    encoder, content_type = choose_encoder(accept)
    openmetrics = content_type.startswith("application/openmetrics-text")
    eof = b"# EOF\n"
    out: list[bytes] = []
    group: list[Metric] = []
    series = 0

    def flush_group(continuation: bool) -> None:
        nonlocal series
        if not group:
            return
        text = _encode(encoder, group)
        if openmetrics and text.endswith(eof):
            text = text[: -len(eof)]
        out.append(_strip_header(text) if continuation else text)
        group.clear()
        series = 0
        pause_for_others()

    pending_continuation = False
    for metric, continuation in to_prometheus(families, namespace):
        if continuation or series >= RENDER_CHUNK:
            flush_group(pending_continuation)
            pending_continuation = continuation
        group.append(metric)
        series += len({tuple(sorted(s.labels.items())) for s in metric.samples}) or 1
    flush_group(pending_continuation)
    if openmetrics:
        out.append(eof)
    return b"".join(out), content_type


# ---------------------------------------------------------------------- merging processes


def _sum_values(kind: str, values: list[Value]) -> Value:
    first = values[0]
    if isinstance(first, HistogramValue):
        same = [v for v in values if isinstance(v, HistogramValue) and v.bounds == first.bounds]
        counts = [sum(v.counts[i] for v in same) for i in range(len(first.counts))]
        return HistogramValue(
            first.bounds,
            tuple(counts),
            sum(v.sum for v in same),
            sum(v.count for v in same),
            min(v.min for v in same),
            max(v.max for v in same),
        )
    if isinstance(first, ExpHistogramValue):
        same_e = [v for v in values if isinstance(v, ExpHistogramValue) and v.scale == first.scale]
        positive: dict[int, int] = {}
        negative: dict[int, int] = {}
        for v in same_e:
            for target, source in ((positive, v.positive), (negative, v.negative)):
                for index, n in source:
                    target[index] = target.get(index, 0) + n
        return ExpHistogramValue(
            first.scale,
            sum(v.zero_count for v in same_e),
            tuple(sorted(positive.items())),
            tuple(sorted(negative.items())),
            sum(v.sum for v in same_e),
            sum(v.count for v in same_e),
            min(v.min for v in same_e),
            max(v.max for v in same_e),
        )
    if isinstance(first, SummaryValue):
        same_s = [v for v in values if isinstance(v, SummaryValue)]
        return SummaryValue(sum(v.sum for v in same_s), sum(v.count for v in same_s))
    return float(sum(v for v in values if isinstance(v, (int, float))))


_CUMULATIVE = ("counter", "histogram", "exponential_histogram", "summary")


def merge_processes(
    views: Sequence[tuple[Sequence[Family], int]],
    retained: Sequence[Family] = (),
) -> list[Family]:
    """One snapshot from several processes' snapshots (each with the time it was taken).

    Cumulative kinds are summed (with ``retained`` totals of processes that ended); gauges
    follow their ``merge`` setting (``last`` picks the most recent snapshot).
    """
    order: list[str] = []
    meta: dict[str, Family] = {}
    values: dict[str, dict[Labels, list[tuple[Value, int]]]] = {}
    for families, seen in [*views, (retained, -1)]:
        for family in families:
            known = meta.get(family.name)
            if known is None:
                meta[family.name] = family
                order.append(family.name)
                values[family.name] = {}
            elif known.kind != family.kind:
                continue
            series = values[family.name]
            for p in family.points:
                series.setdefault(p.labels, []).append((p.value, seen))
    out = []
    for name in order:
        family = meta[name]
        points = []
        for labels, found in values[name].items():
            if family.kind in _CUMULATIVE:
                value = _sum_values(family.kind, [v for v, _ in found])
            else:
                numbers = [(float(v), seen) for v, seen in found if isinstance(v, (int, float))]
                if family.merge == "sum":
                    value = sum(v for v, _ in numbers)
                elif family.merge == "max":
                    value = max(v for v, _ in numbers)
                elif family.merge == "min":
                    value = min(v for v, _ in numbers)
                else:
                    value = max(numbers, key=lambda pair: pair[1])[0]
            points.append(SeriesPoint(labels, value))
        out.append(
            Family(
                family.name,
                family.kind,
                family.description,
                family.unit,
                tuple(points),
                family.merge,
            )
        )
    return out


class _Merger:
    """The endpoint owner's view: its own snapshot, pushed ones, and retained totals."""

    def __init__(self, expire_after_s: float) -> None:
        self.lock = threading.Lock()
        self.expire_after_ns = int(expire_after_s * _NS)
        self.own: Sequence[Family] = ()
        self.own_seen = 0
        self.others: dict[int, tuple[Sequence[Family], int]] = {}
        self.retained: list[Family] = []
        self.generation = 0

    def set_own(self, families: Sequence[Family]) -> None:
        with self.lock:
            self.own = families
            self.own_seen = now_ns()
            self.generation += 1

    def accept(self, pid: int, families: Sequence[Family], final: bool) -> None:
        with self.lock:
            if final:
                self.others.pop(pid, None)
                self._retain(families)
            else:
                self.others[pid] = (families, now_ns())
            self.generation += 1

    def _retain(self, families: Sequence[Family]) -> None:
        kept = [f for f in families if f.kind in _CUMULATIVE]
        if kept:
            self.retained = merge_processes([(kept, 0)], self.retained)

    def snapshot(self) -> list[Family]:
        with self.lock:
            now = now_ns()
            for pid, (families, seen) in list(self.others.items()):
                if now - seen > self.expire_after_ns:
                    del self.others[pid]
                    self._retain(families)
                    self.generation += 1
            if not self.others and not self.retained:
                return list(self.own)
            views = [(self.own, self.own_seen), *self.others.values()]
            return merge_processes(views, self.retained)


# ---------------------------------------------------------------------- the endpoint


_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _checked(family: Family) -> Family:
    """A pushed family as it came, or ValueError when it holds text or values it must not."""
    texts = [family.name, family.description, family.unit, family.merge]
    for point in family.points:
        for key, value in point.labels:
            if not _LABEL_NAME.fullmatch(key):
                raise ValueError(f"family {family.name!r}: bad label name {key!r}")
            texts.append(value)
    for text in texts:
        if clean_text(text) != text:
            raise ValueError(f"family {family.name!r}: text that is not valid UTF-8")
    return family


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    endpoint: PrometheusEndpoint


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Silence per-request logging."""

    def _send(self, status: int, body: bytes, content_type: str, encoding: str = "") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if encoding:
            self.send_header("Content-Encoding", encoding)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        """Serve the merged snapshot, or identify this endpoint to other processes."""
        path = urlparse(self.path).path
        endpoint = self.server.endpoint
        if path == _PING_PATH:
            body = json.dumps({"stepscope": 1, "pid": os.getpid()}).encode()
            self._send(200, body, "application/json")
        elif path in ("/", "/metrics"):
            gzip_ok = "gzip" in (self.headers.get("Accept-Encoding") or "")
            body, content_type, encoding = endpoint.scrape(
                self.headers.get("Accept") or "", gzip_ok
            )
            self._send(200, body, content_type, encoding)
        else:
            self._send(404, b"not found; metrics are at /metrics\n", "text/plain")

    def do_POST(self) -> None:
        """Accept a snapshot pushed by another process on this host."""
        if urlparse(self.path).path != _PUSH_PATH:
            self._send(404, b"not found\n", "text/plain")
            return
        if self.client_address[0] not in ("127.0.0.1", "::1", "::ffff:127.0.0.1"):
            self._send(403, b"pushes are accepted from this host only\n", "text/plain")
            return
        try:
            length = int(self.headers.get("Content-Length") or "0")
            if not 0 < length <= _MAX_PUSH_BYTES:
                raise ValueError(f"bad Content-Length {length}")
            payload = json.loads(self.rfile.read(length))
            families = [_checked(family_from_json(f)) for f in payload["families"]]
            pid = int(payload["pid"])
            final = bool(payload.get("final", False))
        except (ValueError, KeyError, TypeError) as exc:
            self._send(400, f"bad push: {exc}\n".encode(), "text/plain")
            return
        self.server.endpoint.merger.accept(pid, families, final)
        self._send(204, b"", "text/plain")


class PrometheusEndpoint(Exporter):
    """Serves ``/metrics`` on ``host:port`` (default 127.0.0.1:9464) for Prometheus to scrape.

    ``port=0`` picks a free port (see :attr:`port`).  When the port is already served by a
    stepscope endpoint of another process, this one forwards its snapshots there instead.
    """

    name = "prometheus"

    def __init__(
        self,
        port: int = 9464,
        host: str = "127.0.0.1",
        *,
        namespace: str = "",
        expire_after_s: float = 30.0,
    ) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an int in [0, 65535], got {port!r}")
        if expire_after_s <= 0:
            raise ValueError(f"expire_after_s must be > 0, got {expire_after_s!r}")
        self.host = host
        self.port = port
        self.namespace = namespace
        self.expire_after_s = expire_after_s
        self.merger = _Merger(expire_after_s)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._render_lock = threading.Lock()
        self._cache: dict[tuple[str, bool], tuple[int, bytes, str]] = {}
        if not self._serve():
            self._check_peer()

    @property
    def owner(self) -> bool:
        """Whether this process serves the endpoint (else it forwards to the one that does)."""
        return self._server is not None

    @property
    def url(self) -> str:
        """The scrape URL."""
        return f"http://{self.host}:{self.port}/metrics"

    def _serve(self) -> bool:
        try:
            server = _Server((self.host, self.port), _Handler)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE and self.port:
                return False
            raise
        server.endpoint = self
        self._server = server
        self.port = server.server_address[1]
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="stepscope-prometheus",
            daemon=True,
        )
        self._thread.start()
        return True

    def _check_peer(self) -> None:
        try:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=2.0)
            conn.request("GET", _PING_PATH)
            reply = conn.getresponse()
            ok = reply.status == 200 and json.loads(reply.read()).get("stepscope") == 1
            conn.close()
        except (OSError, ValueError, http.client.HTTPException):
            ok = False
        if not ok:
            raise OSError(
                errno.EADDRINUSE,
                f"port {self.port} on {self.host} is in use by something that is not a stepscope "
                "metrics endpoint; pick another port (or port=0 for a free one)",
            )

    def scrape(self, accept: str, gzip_ok: bool) -> tuple[bytes, str, str]:
        """Body, content type and content encoding for one scrape (cached per export)."""
        _, content_type = choose_encoder(accept)
        key = (content_type, gzip_ok)
        with self._render_lock:
            generation = self.merger.generation
            cached = self._cache.get(key)
            if cached is None or cached[0] != generation:
                body, content_type = render(self.merger.snapshot(), accept, self.namespace)
                if gzip_ok:
                    body = gzip.compress(body, compresslevel=1)
                cached = (generation, body, content_type)
                self._cache[key] = cached
        return cached[1], cached[2], "gzip" if gzip_ok else ""

    def export(self, batch: ExportBatch, timeout_s: float) -> None:
        """Publish the batch's snapshot (or push it to the owning process)."""
        families = with_rank_labels(with_step_families(batch.families))
        if self._server is not None:
            self.merger.set_own(families)
            return
        try:
            self._push(families, batch.final, timeout_s)
        except ConnectionRefusedError:
            # the owner is gone: serve the port ourselves if we can
            if not self._serve():
                raise
            LOGGER.warning("stepscope.metrics: took over the endpoint on port %d", self.port)
            self.merger.set_own(families)

    def _push(self, families: Sequence[Family], final: bool, timeout_s: float) -> None:
        body = json.dumps(
            {
                "pid": os.getpid(),
                "final": final,
                "families": [family_to_json(f) for f in families],
            },
            separators=(",", ":"),
        ).encode()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout_s)
        try:
            conn.request("POST", _PUSH_PATH, body, {"Content-Type": "application/json"})
            reply = conn.getresponse()
            reply.read()
            if reply.status != 204:
                raise OSError(f"endpoint on port {self.port} refused the push: {reply.status}")
        finally:
            conn.close()

    def after_fork_in_child(self) -> None:
        """A forked child forwards to the parent's endpoint; it never serves the parent's socket."""
        server = self._server
        if server is not None:
            with contextlib.suppress(OSError):
                server.socket.close()
        self._server = None
        self._thread = None
        self._render_lock = threading.Lock()
        self._cache = {}
        self.merger = _Merger(self.expire_after_s)

    def close(self) -> None:
        """Stop serving."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()


# ---------------------------------------------------------------------- pushgateway


def _default_grouping_key() -> dict[str, str]:
    key = {"instance": socket.gethostname()}
    rank = os.environ.get("RANK")
    if rank is not None:
        key["rank"] = rank
    return key


class PushgatewayExporter(Exporter):
    """Pushes the snapshot to a Prometheus Pushgateway (``PUT``: replaces the group each time).

    The grouping key defaults to ``instance=<hostname>`` (plus ``rank`` from ``$RANK``); a
    forked child adds ``pid`` so it does not overwrite its parent's group.
    """

    name = "pushgateway"

    def __init__(
        self,
        url: str,
        job: str = "stepscope",
        grouping_key: dict[str, str] | None = None,
        *,
        namespace: str = "",
        delete_on_close: bool = False,
    ) -> None:
        if not isinstance(url, str) or not url:
            raise ValueError(f"url must be the Pushgateway's address, got {url!r}")
        self.url = url
        self.job = job
        self.grouping_key = dict(_default_grouping_key() if grouping_key is None else grouping_key)
        self.namespace = namespace
        self.delete_on_close = delete_on_close
        self.pushes = 0

    def export(self, batch: ExportBatch, timeout_s: float) -> None:
        """Push the batch's snapshot."""
        push_to_gateway(
            self.url,
            job=self.job,
            registry=_PausingCollector(with_step_families(batch.families), self.namespace),
            grouping_key=self.grouping_key,
            timeout=timeout_s,
        )
        self.pushes += 1

    def after_fork_in_child(self) -> None:
        """A forked child pushes to its own group."""
        self.grouping_key["pid"] = str(os.getpid())
        self.pushes = 0

    def close(self) -> None:
        """Delete the group when asked to."""
        if self.delete_on_close and self.pushes:
            delete_from_gateway(self.url, job=self.job, grouping_key=self.grouping_key, timeout=2)
