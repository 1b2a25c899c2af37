"""Instruments: counters, gauges, histograms, scalars; labels, limits, registration, tensors."""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Iterator

import pytest

from stepscope.failures import set_strict
from stepscope.metrics import Pipeline
from stepscope.metrics.failures import failure_counts
from stepscope.metrics.instruments import ExpHistogramSeries
from stepscope.metrics.points import ExpHistogramValue, HistogramValue
from stepscope.steps import set_step
from tests.metrics_fixtures import CollectingExporter

pytestmark = pytest.mark.implementation_independent


@pytest.fixture
def pipe() -> Iterator[tuple[Pipeline, CollectingExporter]]:
    pipeline = Pipeline(interval_s=60, handle_sigterm=False)
    exporter = CollectingExporter()
    pipeline.add_exporter(exporter)
    yield pipeline, exporter
    pipeline.shutdown(timeout_s=5)


def test_counter_totals_across_threads(pipe: tuple[Pipeline, CollectingExporter]) -> None:
    pipeline, exporter = pipe
    requests = pipeline.counter("requests", "handled requests")
    by_rank = requests.bind(rank=1)

    def work() -> None:
        for _ in range(5000):
            requests.inc()
            by_rank.inc(2)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pipeline.flush(10)
    values = exporter.values("requests")
    assert values[()] == 20000
    assert values[(("rank", "1"),)] == 40000
    assert exporter.family("requests").kind == "counter"
    assert exporter.family("requests").description == "handled requests"


def test_counter_rejects_negative_and_non_numbers_without_raising(
    pipe: tuple[Pipeline, CollectingExporter],
) -> None:
    pipeline, exporter = pipe
    c = pipeline.counter("c")
    before = failure_counts().get("invalid_value", 0)
    c.inc(-1)
    c.inc("three")  # type: ignore[arg-type]
    c.inc(True)  # bool counts as 1
    c.inc(2.5)
    assert failure_counts()["invalid_value"] - before == 2
    assert pipeline.flush(10)
    assert exporter.values("c")[()] == 3.5
    set_strict(True)
    with pytest.raises(ValueError, match="only goes up"):
        c.inc(-5)


def test_bind_is_stable_and_validates_label_names(
    pipe: tuple[Pipeline, CollectingExporter],
) -> None:
    pipeline, _ = pipe
    c = pipeline.counter("bound")
    assert c.bind(rank=0, host="a") is c.bind(host="a", rank=0)
    assert c.bind() is c
    for bad in ("le", "overflow", "__x", "1abc", "a-b"):
        with pytest.raises(ValueError, match="label name"):
            c.bind(**{bad: "v"})


def test_cardinality_limit_folds_into_overflow_series(
    pipe: tuple[Pipeline, CollectingExporter],
) -> None:
    pipeline, exporter = pipe
    c = pipeline.counter("per_user", limit=3)
    for user in range(10):
        c.bind(user=user).inc()
    assert pipeline.flush(10)
    values = exporter.values("per_user")
    assert values[(("user", "0"),)] == 1
    assert values[(("overflow", "true"),)] == 8  # users 2..9 (the overflow series takes a slot)
    assert len(values) == 3
    assert pipeline.telemetry()["overflowed_label_sets"] == {"per_user": 8}


def test_registration_is_idempotent_and_conflicts_are_clear(
    pipe: tuple[Pipeline, CollectingExporter],
) -> None:
    pipeline, _ = pipe
    assert pipeline.counter("x") is pipeline.counter("x")
    assert pipeline.histogram("h", buckets=[1, 2]) is pipeline.histogram("h", buckets=[1.0, 2.0])
    with pytest.raises(ValueError, match="already registered as a counter"):
        pipeline.gauge("x")
    with pytest.raises(ValueError, match="already registered with options"):
        pipeline.histogram("h", buckets=[1, 3])
    with pytest.raises(ValueError, match="already registered with options"):
        pipeline.scalar("s_sum", "sum") and pipeline.scalar("s_sum", "max")
    with pytest.raises(ValueError, match="metric name"):
        pipeline.counter("bad name")
    with pytest.raises(ValueError, match="reduce must be one of"):
        pipeline.scalar("s2", "median")
    with pytest.raises(ValueError, match="limit"):
        pipeline.counter("lim", limit=0)


def test_gauge_set_inc_dec(pipe: tuple[Pipeline, CollectingExporter]) -> None:
    pipeline, exporter = pipe
    g = pipeline.gauge("inflight")
    g.inc(5)
    g.dec(2)
    g.bind(pool="a").set(0.25)
    pipeline.gauge("never_set")
    assert pipeline.flush(10)
    assert exporter.values("inflight") == {(): 3, (("pool", "a"),): 0.25}
    with pytest.raises(KeyError):
        exporter.family("never_set")  # a gauge never set is not exported
    with pytest.raises(ValueError, match="merge"):
        pipeline.gauge("bad_merge", merge="avg")


def test_explicit_histogram_buckets_are_le(pipe: tuple[Pipeline, CollectingExporter]) -> None:
    pipeline, exporter = pipe
    h = pipeline.histogram("latency", buckets=[0.1, 1.0, 10.0])
    for v in (0.05, 0.1, 0.5, 1.0, 5.0, 50.0):
        h.observe(v)
    h.observe(float("nan"))  # ignored and counted
    assert pipeline.flush(10)
    value = exporter.values("latency")[()]
    assert isinstance(value, HistogramValue)
    assert value.counts == (2, 2, 1, 1)
    assert value.count == 6
    assert value.sum == pytest.approx(56.65)
    assert (value.min, value.max) == (0.05, 50.0)
    assert value.cumulative() == [(0.1, 2), (1.0, 4), (10.0, 5), (math.inf, 6)]
    with pytest.raises(ValueError, match="increasing"):
        pipeline.histogram("bad", buckets=[2, 1])
    with pytest.raises(TypeError, match="sequence of numbers"):
        pipeline.histogram("bad2", buckets=["a"])  # type: ignore[list-item]


@pytest.mark.parametrize("scale", [-2, 0, 1, 3, 8])
def test_exponential_bucket_index_matches_definition(scale: int) -> None:
    series = ExpHistogramSeries("e", (), None, scale)  # type: ignore[arg-type]
    base = 2.0 ** (2.0**-scale)
    rng = random.Random(scale)
    values = [rng.uniform(1e-6, 1e6) for _ in range(2000)]
    values += [2.0**k for k in range(-20, 21)]
    for v in values:
        i = series.index(v)
        low, high = base**i, base ** (i + 1)
        # base**i < v <= base**(i+1), with a tolerance of float rounding at the boundary
        assert low < v * (1 + 1e-12) and v <= high * (1 + 1e-12), (v, i, low, high)
    step = 2 ** max(0, -scale)  # below scale 0 only every step-th power of two is a boundary
    for k in range(-20, 21, step):  # a boundary value is the upper bound of its bucket
        i = series.index(2.0**k)
        assert math.isclose(base ** (i + 1), 2.0**k, rel_tol=1e-9)


def test_exponential_histogram_tracks_zero_negative_sum_min_max(
    pipe: tuple[Pipeline, CollectingExporter],
) -> None:
    pipeline, exporter = pipe
    h = pipeline.histogram("sizes", exponential=True, scale=0)
    for v in (1.0, 3.0, 3.5, 0.0, -2.0):
        h.observe(v)
    assert pipeline.flush(10)
    value = exporter.values("sizes")[()]
    assert isinstance(value, ExpHistogramValue)
    assert value.positive == ((-1, 1), (1, 2))  # 1 in (0.5, 1]; 3 and 3.5 in (2, 4]
    assert value.negative == ((0, 1),)  # |-2| in (1, 2]
    assert (value.zero_count, value.count, value.sum) == (1, 5, 5.5)
    assert (value.min, value.max) == (-2.0, 3.5)
    cumulative = value.cumulative()
    assert cumulative[-1] == (math.inf, 5)
    assert cumulative[0] == (-1.0, 1)
    with pytest.raises(ValueError, match="either buckets"):
        pipeline.histogram("both", buckets=[1], exponential=True)


def test_scalar_reduces_per_step_and_closes_finished_steps(
    pipe: tuple[Pipeline, CollectingExporter],
) -> None:
    pipeline, exporter = pipe
    loss = pipeline.scalar("loss")  # mean
    tokens = pipeline.scalar("tokens", "sum")
    peak = pipeline.scalar("peak", "max").bind(rank=0)
    for step in range(3):
        set_step(step)
        for v in (1.0, 2.0, 6.0):
            loss.record(v + step)
            tokens.record(v)
            peak.record(v * step)
    pipeline.flush(10)
    points = {(p.name, p.step): p for p in exporter.scalars()}
    assert points[("loss", 0)].value == 3.0
    assert points[("loss", 2)].value == 5.0
    assert points[("loss", 1)].count == 3
    assert points[("tokens", 1)].value == 9.0
    assert points[("peak", 2)].value == 12.0 and points[("peak", 2)].labels == (("rank", "0"),)
    # the pull-style family shows the newest closed step
    assert exporter.values("loss")[()] == 5.0


def test_scalar_periodic_export_keeps_the_current_step_open(
    pipe: tuple[Pipeline, CollectingExporter],
) -> None:
    pipeline, exporter = pipe
    s = pipeline.scalar("acc", "last")
    set_step(4)
    s.record(0.1)
    set_step(5)
    s.record(0.2)
    s.record(0.3, step=5)
    pipeline._cycle(close_all=False, final=False)  # what the periodic export does
    assert [(p.step, p.value) for p in exporter.scalars()] == [(4, 0.1)]
    pipeline.flush(10)
    assert [(p.step, p.value) for p in exporter.scalars()] == [(4, 0.1), (5, 0.3)]
    before = failure_counts().get("invalid_value", 0)
    s.record(1.0, step=-1)
    assert failure_counts()["invalid_value"] == before + 1


def test_scalar_without_a_step_reduces_per_interval(
    pipe: tuple[Pipeline, CollectingExporter],
) -> None:
    pipeline, exporter = pipe
    set_step(None)
    s = pipeline.scalar("throughput", "min")
    s.record(5)
    s.record(3)
    pipeline._cycle(close_all=False, final=False)
    assert [(p.step, p.value, p.count) for p in exporter.scalars()] == [(None, 3.0, 2)]


def test_tensor_values_are_not_synchronised_on_the_hot_path(
    pipe: tuple[Pipeline, CollectingExporter], monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    pipeline, exporter = pipe
    loss = pipeline.scalar("tloss")
    seen = pipeline.counter("tseen")
    hist = pipeline.histogram("thist", buckets=[1.0])
    gauge = pipeline.gauge("tgauge")
    weight = torch.ones((), requires_grad=True)
    value = weight * 3.0  # has a grad_fn: the ring must hold a detached copy
    set_step(0)

    caller = threading.get_ident()

    def no_sync_on_caller(name: str) -> object:
        original = getattr(torch.Tensor, name)

        def guarded(*args: object, **kwargs: object) -> object:
            # the export thread may resolve tensors meanwhile: only the caller must not
            if threading.get_ident() == caller:
                raise AssertionError(f"a tensor was read ({name}) on the caller's thread")
            return original(*args, **kwargs)

        return guarded

    with monkeypatch.context() as m:
        for name in ("item", "tolist", "__float__", "__bool__", "cpu", "numpy"):
            m.setattr(torch.Tensor, name, no_sync_on_caller(name))
        loss.record(value)
        seen.inc(torch.tensor(2.0))
        hist.observe(torch.tensor(0.5))
        gauge.set(torch.tensor(7.0))
        queued = [item[2] for item in list(pipeline.ring.items)]
        assert all(not t.requires_grad for t in queued if isinstance(t, torch.Tensor))
    set_step(1)
    assert pipeline.flush(10)
    assert exporter.scalars()[0].value == 3.0
    assert exporter.values("tseen")[()] == 2.0
    assert exporter.values("thist")[()].counts == (1, 0)
    assert exporter.values("tgauge")[()] == 7.0
    before = failure_counts().get("invalid_value", 0)
    loss.record(torch.ones(3))  # not a scalar: refused on the spot, counted
    assert failure_counts()["invalid_value"] == before + 1
