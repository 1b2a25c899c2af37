"""schedule(): torch's exact semantics, checked against torch.profiler.schedule itself."""

from __future__ import annotations

import itertools
import warnings

import pytest

from stepscope import ProfilerAction, schedule

pytestmark = pytest.mark.implementation_independent


def names(fn: object, steps: int = 201) -> list[str]:
    return [fn(s).name for s in range(steps)]  # type: ignore[operator]


@pytest.mark.torch
def test_schedule_matches_torch_over_a_grid() -> None:
    torch_profiler = pytest.importorskip("torch.profiler")
    grid = itertools.product(range(3), range(3), range(1, 4), range(3), range(3), range(2))
    checked = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for wait, warmup, active, repeat, skip_first, skip_first_wait in grid:
            kwargs = dict(
                wait=wait,
                warmup=warmup,
                active=active,
                repeat=repeat,
                skip_first=skip_first,
                skip_first_wait=skip_first_wait,
            )
            ours = names(schedule(**kwargs))
            theirs = names(torch_profiler.schedule(**kwargs))
            assert ours == theirs, kwargs
            checked += 1
    assert checked == 3 * 3 * 3 * 3 * 3 * 2


def test_record_and_save_ends_each_cycle() -> None:
    fn = schedule(wait=1, warmup=1, active=2, repeat=2)
    assert names(fn, 10) == [
        "NONE",
        "WARMUP",
        "RECORD",
        "RECORD_AND_SAVE",
        "NONE",
        "WARMUP",
        "RECORD",
        "RECORD_AND_SAVE",
        "NONE",
        "NONE",
    ]


def test_repeat_zero_repeats_forever_and_skip_first_wait_drops_first_wait() -> None:
    fn = schedule(wait=2, warmup=1, active=1, skip_first=1, skip_first_wait=1)
    assert names(fn, 10) == [
        "NONE",
        "WARMUP",
        "RECORD_AND_SAVE",
        "NONE",
        "NONE",
        "WARMUP",
        "RECORD_AND_SAVE",
        "NONE",
        "NONE",
        "WARMUP",
    ]
    assert fn(10_001) in set(ProfilerAction)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"wait": -1, "warmup": 1, "active": 1}, "wait must be zero or more, got -1"),
        ({"wait": 0, "warmup": -2, "active": 1}, "warmup must be zero or more"),
        ({"wait": 0, "warmup": 1, "active": 0}, "active must be positive, got 0"),
        ({"wait": 0, "warmup": 1, "active": 1, "repeat": -1}, "repeat must be zero or more"),
        ({"wait": 0, "warmup": 1, "active": 1, "skip_first": -3}, "skip_first must be"),
        ({"wait": 0, "warmup": 1, "active": 1, "skip_first_wait": -1}, "skip_first_wait must"),
        ({"wait": 1.5, "warmup": 1, "active": 1}, "wait must be an int"),
        ({"wait": True, "warmup": 1, "active": 1}, "wait must be an int"),
    ],
)
def test_invalid_arguments_name_the_argument(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        schedule(**kwargs)  # type: ignore[arg-type]


def test_warmup_zero_warns_like_torch() -> None:
    with pytest.warns(UserWarning, match="won't be using warmup"):
        schedule(wait=0, warmup=0, active=1)


def test_negative_step_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="step must be zero or more"):
        schedule(wait=0, warmup=1, active=1)(-1)
