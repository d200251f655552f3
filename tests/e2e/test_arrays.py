"""A job array on the real platform (web, dispatcher, four fake agents as processes): 200 tiny
tasks with %8 on 16 GPUs never have more than 8 tasks placed at once, and all 200 succeed."""

from datetime import datetime

import pytest

from tests.e2e.platform import Platform

pytestmark = pytest.mark.e2e
NODES = {f"e2e-arr{n}": ("H100-80GB", 4, f"rack=r{n}") for n in range(1, 5)}  # 16 GPUs in all
SIZE, THROTTLE = 200, 8


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    platform = Platform(
        tmp_path_factory.mktemp("arrays"), name="gpuplatform_e2e_arrays", own_redis=True
    )
    try:
        yield platform.start(NODES)
    finally:
        platform.stop()


def _at(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_a_throttled_array_never_runs_more_than_its_throttle_and_every_task_succeeds(platform):
    answer = platform.post("bob", "/api/v1/jobs/", {
        "command": ["true"],
        "gpus": 1, "gpu_sku": "H100-80GB", "max_runtime_seconds": 60, "array": f"0-{SIZE - 1}%{THROTTLE}",
    })  # fmt: skip
    assert answer.status_code == 201, answer.text
    array = answer.json()
    assert array["size"] == SIZE and array["throttle"] == THROTTLE
    samples = []

    def done() -> bool:
        body = platform.get("bob", f"/api/v1/arrays/{array['id']}/").json()
        counts = body["counts"]
        samples.append(counts["starting"] + counts["running"] + counts["preempting"])
        assert counts["failed"] == 0 and counts["cancelled"] == 0, body
        return counts["succeeded"] == SIZE

    platform.wait_until(done, timeout=240, what=f"{SIZE} tasks succeeded", interval=0.1)
    assert max(samples) <= THROTTLE, samples
    assert max(samples) >= 2  # it did run tasks side by side
    body = platform.get("bob", f"/api/v1/arrays/{array['id']}/").json()
    assert body["state"] == "ended" and body["progress"] == 1.0
    # Every task as a job, in index order, each with its attempt's times: at no moment were more
    # than THROTTLE attempts between their placement and their end.
    tasks = platform.get("bob", f"{array['tasks_url']}&page_size=1000").json()
    assert tasks["count"] == SIZE
    assert [t["array_index"] for t in tasks["results"]] == list(range(SIZE))
    assert {t["state"] for t in tasks["results"]} == {"succeeded"}
    edges = []
    for task in tasks["results"]:
        for attempt in task["attempts"]:
            edges += [(_at(attempt["placed_at"]), 1), (_at(attempt["ended_at"]), -1)]
    placed, most = 0, 0
    for _, step in sorted(edges, key=lambda e: (e[0], e[1])):  # an end before a start at a tie
        placed += step
        most = max(most, placed)
    assert most <= THROTTLE, most
    first, last = min(e[0] for e in edges), max(e[0] for e in edges)
    runs = [
        (_at(a["ended_at"]) - _at(a["placed_at"])).total_seconds()
        for t in tasks["results"]
        for a in t["attempts"]
    ]
    print(
        f"array: {SIZE} tasks in {(last - first).total_seconds():.1f}s, at most {most} placed at once, "
        f"attempts {sum(runs) / len(runs):.2f}s on average"
    )
