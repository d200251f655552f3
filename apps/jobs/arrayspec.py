"""Job array specs in Slurm's `--array` syntax, and the per-task parameters of a sweep.

Pure Python (no Django): the submit's validation (apps/jobs/serializers.py) and the lazy tasks
(apps/admission/arrays.py) use it, and its tests run without a database.

    0-999        indices 0 to 999
    0-99:2       0, 2, ..., 98 (a step after a range)
    1,5,9        a list
    1,3-7:2,20   a mix: 1, 3, 5, 7, 20
    0-999%16     any of the above, at most 16 tasks placed at once

Refused (ArraySpecError, which the API answers as 400 naming `array`): an empty spec, anything
but digits, `-`, `:`, `,` and one `%N`; a negative index; a reversed range (`9-1`); a step of 0
or one without a range; `%0`; an index listed twice (Slurm folds duplicates silently: here it is
more likely a typo); more tasks than `max_tasks`; an index above MAX_INDEX.

Tasks are ordered by index: a task's *position* is its place in that order (0 .. size-1), which
is what `array_params` and the grid expansion are indexed by.
"""

from __future__ import annotations

import bisect
import itertools
import re
from dataclasses import dataclass
from functools import lru_cache

MAX_INDEX = 2_147_483_647  # a PostgreSQL integer (Job.array_index)
MAX_SPEC_LENGTH = 1000  # JobArray.spec
_ITEM = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


class ArraySpecError(ValueError):
    """A spec, `array_params` or `array_grid` that cannot be used; `field` names which."""

    def __init__(self, message: str, field: str = "array"):
        super().__init__(message)
        self.message = message
        self.field = field


@dataclass(frozen=True)
class Segment:
    """start, start + step, ..., up to stop inclusive."""

    start: int
    stop: int
    step: int = 1

    def __len__(self) -> int:
        return (self.stop - self.start) // self.step + 1

    def values(self) -> range:
        return range(self.start, self.stop + 1, self.step)


@dataclass(frozen=True)
class ArraySpec:
    spec: str  # as given (stripped)
    segments: tuple[Segment, ...]
    size: int
    throttle: int | None  # %N; None: no cap

    def indices(self) -> list[int]:
        """Every index in ascending order (cached per spec: a listing pages through it)."""
        return list(_indices(self.segments))

    def index_at(self, position: int) -> int:
        return _indices(self.segments)[position]

    def position_of(self, index: int) -> int | None:
        ordered = _indices(self.segments)
        at = bisect.bisect_left(ordered, index)
        return at if at < len(ordered) and ordered[at] == index else None


@lru_cache(maxsize=64)
def _indices(segments: tuple[Segment, ...]) -> tuple[int, ...]:
    if len(segments) == 1:
        return tuple(segments[0].values())
    return tuple(sorted(itertools.chain.from_iterable(s.values() for s in segments)))


def parse(spec: object, *, max_tasks: int) -> ArraySpec:
    """The parsed spec, or ArraySpecError saying what is wrong with it."""
    if not isinstance(spec, str):
        raise ArraySpecError('must be a string in Slurm\'s --array syntax, e.g. "0-99%8"')
    text = spec.strip()
    if not text:
        raise ArraySpecError('must not be empty: give indices, e.g. "0-99" or "1,5,9"')
    if len(text) > MAX_SPEC_LENGTH:
        raise ArraySpecError(f"must be at most {MAX_SPEC_LENGTH} characters")
    throttle = None
    if "%" in text:
        text, _, limit = text.partition("%")
        if not limit.isdecimal() or not limit.isascii():
            raise ArraySpecError(f"%{limit}: the throttle must be a whole number, e.g. %8")
        throttle = int(limit)
        if throttle == 0:
            raise ArraySpecError("%0 would never run a task: the throttle must be at least 1")
        if throttle > MAX_INDEX:
            raise ArraySpecError(f"%{limit}: the throttle must be at most {MAX_INDEX}")
    segments = []
    size = 0
    for item in text.split(","):
        segment = _segment(item.strip())
        segments.append(segment)
        size += len(segment)
        if size > max_tasks:
            raise ArraySpecError(f"{size if len(segments) == 1 else 'more than ' + str(max_tasks)} tasks: "
                                 f"an array may have at most {max_tasks}")  # fmt: skip
    _refuse_duplicates(segments)
    canonical = text.strip() + (f"%{throttle}" if throttle is not None else "")
    return ArraySpec(spec=canonical, segments=tuple(segments), size=size, throttle=throttle)


def _segment(item: str) -> Segment:
    if not item:
        raise ArraySpecError("an empty item (two commas, or a comma at an end)")
    if item.startswith("-"):
        raise ArraySpecError(f"{item}: indices must not be negative")
    match = _ITEM.match(item) if item.isascii() else None
    if match is None:
        raise ArraySpecError(f"{item!r} is not an index, a range (0-9) or a stepped range (0-9:2)")
    start = int(match[1])
    stop = int(match[2]) if match[2] is not None else start
    step = int(match[3]) if match[3] is not None else 1
    if stop < start:
        raise ArraySpecError(f"{item}: a reversed range (its end is below its start)")
    if step == 0:
        raise ArraySpecError(f"{item}: the step must be at least 1")
    if stop > MAX_INDEX:
        raise ArraySpecError(f"{item}: indices must be at most {MAX_INDEX}")
    return Segment(start=start, stop=stop - (stop - start) % step, step=step)


def _refuse_duplicates(segments: list[Segment]) -> None:
    if len(segments) == 1:
        return
    seen: set[int] = set()
    for segment in segments:
        for index in segment.values():
            if index in seen:
                raise ArraySpecError(f"index {index} is listed twice")
            seen.add(index)


# --- per-task parameters -----------------------------------------------------------------------


def grid_size(grid: object) -> int:
    """The number of points of `array_grid`: the product of its lists' lengths."""
    if not isinstance(grid, dict) or not grid:
        raise ArraySpecError(
            'must be an object of parameter name to a list of values, e.g. {"lr": [0.1, 0.01]}',
            field="array_grid",
        )
    size = 1
    for name, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ArraySpecError(f"{name}: must be a non-empty list of values", field="array_grid")
        size *= len(values)
    return size


def grid_point(grid: dict, position: int) -> dict:
    """The `position`-th point of the grid in itertools.product order: keys in the order given,
    the last key changing fastest (tests/unit/test_arrayspec.py holds it equal to product)."""
    point = {}
    for name in reversed(list(grid)):
        values = grid[name]
        position, at = divmod(position, len(values))
        point[name] = values[at]
    return dict(reversed(list(point.items())))


def check_params_list(params: object, size: int | None) -> int:
    """`array_params`: a list of params objects, one per task (by position). Its length, which
    must equal the array's size where one was given."""
    if not isinstance(params, list) or not params:
        raise ArraySpecError(
            "must be a non-empty list of params objects, one per task", field="array_params"
        )
    for position, item in enumerate(params):
        if not isinstance(item, dict):
            raise ArraySpecError(f"[{position}]: must be a params object", field="array_params")
    if size is not None and len(params) != size:
        raise ArraySpecError(
            f"has {len(params)} entries but the array has {size} tasks: give one per task",
            field="array_params",
        )
    return len(params)


def task_params(base: dict, params: list, grid: dict, position: int) -> dict:
    """A task's params: the submit's `params`, with its own (array_params[position] or the grid's
    point) merged over them."""
    if params:
        return {**base, **params[position]}
    if grid:
        return {**base, **grid_point(grid, position)}
    return dict(base)
