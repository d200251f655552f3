"""Slurm's --array syntax and the sweep's per-task parameters (apps/jobs/arrayspec.py): pure,
no database."""

import itertools

import pytest

from apps.jobs.arrayspec import (
    ArraySpecError,
    check_params_list,
    grid_point,
    grid_size,
    parse,
    task_params,
)

MAX = 100_000


@pytest.mark.parametrize(
    ("spec", "indices", "throttle"),
    [
        ("0", [0], None),
        ("7", [7], None),
        ("0-4", [0, 1, 2, 3, 4], None),
        ("0-9:2", [0, 2, 4, 6, 8], None),
        ("0-10:5", [0, 5, 10], None),
        ("1-8:3", [1, 4, 7], None),
        ("1,5,9", [1, 5, 9], None),
        ("1,3-7:2,20", [1, 3, 5, 7, 20], None),
        ("20,1,3-7:2", [1, 3, 5, 7, 20], None),  # tasks are in index order
        ("0-10:2,1-11:2", list(range(12)), None),  # interleaved ranges, no index twice
        ("0-999%16", list(range(1000)), 16),
        ("1,5,9%1", [1, 5, 9], 1),
        ("0-3%100", [0, 1, 2, 3], 100),  # a throttle above the size caps nothing
        (" 0-3 ", [0, 1, 2, 3], None),
    ],
)
def test_accepted(spec, indices, throttle):
    parsed = parse(spec, max_tasks=MAX)
    assert parsed.indices() == indices
    assert parsed.size == len(indices)
    assert parsed.throttle == throttle
    for position, index in enumerate(indices):
        assert parsed.index_at(position) == index
        assert parsed.position_of(index) == position
    assert parsed.position_of(max(indices) + 1) is None


def test_the_largest_array_is_accepted_and_one_more_is_not():
    assert parse("0-99999", max_tasks=MAX).size == MAX
    with pytest.raises(ArraySpecError, match="at most 100000"):
        parse("0-100000", max_tasks=MAX)
    with pytest.raises(ArraySpecError, match="at most 100000"):
        parse("0-60000,60001-100000", max_tasks=MAX)  # over the cap across items too
    with pytest.raises(ArraySpecError, match="at most 10"):
        parse("0-10", max_tasks=10)


def test_a_huge_range_is_refused_without_being_expanded():
    with pytest.raises(ArraySpecError, match="tasks"):
        parse("0-2000000000", max_tasks=MAX)  # answers at once: only its length is computed


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("9-1", "reversed"),
        ("-1", "negative"),
        ("-3-5", "negative"),
        ("0-9%0", "%0"),
        ("0-9%", "throttle"),
        ("0-9%x", "throttle"),
        ("0-9%-2", "throttle"),
        ("0-9%2%3", "throttle"),
        ("0-9:0", "step"),
        ("5:2", "not an index"),
        ("1,,2", "empty item"),
        ("1,2,", "empty item"),
        ("1,5,5", "twice"),
        ("0-9,5", "twice"),
        ("abc", "not an index"),
        ("1.5", "not an index"),
        ("0x10", "not an index"),
        ("١٢", "not an index"),  # digits, but not ASCII ones
        ("0-99999999999", "at most 2147483647"),
        ("0-3%99999999999", "at most 2147483647"),
        ("1 2", "not an index"),
        ("x" * 1001, "1000 characters"),
    ],
)
def test_refused(spec, words):
    with pytest.raises(ArraySpecError, match=words.replace("%", "%")) as error:
        parse(spec, max_tasks=MAX)
    assert error.value.field == "array"


@pytest.mark.parametrize("spec", [None, 5, ["0-3"], {"a": 1}, True])
def test_not_a_string_is_refused(spec):
    with pytest.raises(ArraySpecError, match="string"):
        parse(spec, max_tasks=MAX)


def test_grid_order_is_itertools_product_last_key_fastest():
    grid = {"lr": [0.1, 0.01, 0.001], "batch": [16, 32], "opt": ["sgd", "adam"]}
    assert grid_size(grid) == 12
    expected = [
        dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())
    ]
    assert [grid_point(grid, p) for p in range(12)] == expected
    assert grid_point(grid, 0) == {"lr": 0.1, "batch": 16, "opt": "sgd"}
    assert grid_point(grid, 1) == {"lr": 0.1, "batch": 16, "opt": "adam"}
    assert grid_point(grid, 2) == {"lr": 0.1, "batch": 32, "opt": "sgd"}
    assert list(grid_point(grid, 5)) == ["lr", "batch", "opt"]  # keys keep the grid's order


@pytest.mark.parametrize("grid", [{}, [], "lr", {"lr": []}, {"lr": 0.1}, {"lr": [1], "b": {}}])
def test_bad_grids_name_array_grid(grid):
    with pytest.raises(ArraySpecError) as error:
        grid_size(grid)
    assert error.value.field == "array_grid"


def test_params_list():
    assert check_params_list([{"a": 1}, {"a": 2}], 2) == 2
    assert check_params_list([{"a": 1}, {}], None) == 2
    for bad, size in (([], None), ({"a": 1}, None), ([{"a": 1}, 3], 2), ([{"a": 1}], 2)):
        with pytest.raises(ArraySpecError) as error:
            check_params_list(bad, size)
        assert error.value.field == "array_params"


def test_task_params_merge_the_index_over_the_base():
    base = {"lr": 0.5, "epochs": 3}
    assert task_params(base, [{"lr": 0.1}, {"seed": 2}], {}, 0) == {"lr": 0.1, "epochs": 3}
    assert task_params(base, [{"lr": 0.1}, {"seed": 2}], {}, 1) == {
        "lr": 0.5,
        "epochs": 3,
        "seed": 2,
    }
    assert task_params(base, [], {"lr": [1, 2]}, 1) == {"lr": 2, "epochs": 3}
    assert task_params(base, [], {}, 7) == base


def test_a_tasks_id_text_is_its_uuid5():
    import uuid

    from apps.jobs.arrays import task_id, task_id_text

    for _ in range(50):
        array = uuid.uuid4()
        for index in (0, 1, 9, 12345, 2_147_483_647):
            assert (
                task_id_text(array.bytes, index)
                == str(task_id(array, index))
                == str(uuid.uuid5(array, str(index)))
            )
