"""The commands that read and change what exists: `list`, `show`, `cancel`, `artifacts`,
`templates` and `nodes`. Ids may be a unique prefix (the API completes them)."""

from __future__ import annotations

import datetime
import json
import os

from .api import TERMINAL, ApiError, Client

STATES = ("queued", "starting", "running", "preempting", "succeeded", "failed", "cancelled")
RUNNING = ("starting", "running", "preempting")
COLUMNS = ("ID", "STATE", "PROG", "TIER", "GPUS", "SUBMITTED", "STARTED", "DURATION", "NODE")


# --- list and show ---------------------------------------------------------------------------


def cmd_list(client: Client, args) -> int:
    page = client.list(state=args.state, tier=args.tier, page=args.page, array=args.array)
    if args.json:
        print(json.dumps(page, indent=2))
        return 0
    print(_row(*COLUMNS, "NAME"))
    arrays: dict[str, dict | None] = {}
    for job in page["results"]:
        array_id = job.get("array")
        if array_id and not args.array:  # one row per array, where its first task is
            if array_id not in arrays:
                array = arrays[array_id] = _maybe_array(client, array_id)
                if array is not None:
                    print(array_line(array))
            if arrays[array_id] is not None:
                continue
        print(job_row(job))
    if page.get("next"):
        print(f"... {page['count']} in all; --page for more")
    return 0


def _row(ident, state, progress, tier, gpus, submitted, started, duration, node, name) -> str:
    return (f"{ident:<36}  {state:<10} {progress:>4}  {tier:<10} {gpus:>4}  {submitted:<11}  "
            f"{started:<11}  {duration:>8}  {node:<12} {name}")  # fmt: skip


def job_row(job: dict) -> str:
    index = f"[{job['array_index']}]" if job.get("array_index") is not None else ""
    ident = job["id"] or f"(task {job.get('array_index')})"  # a task not made yet has no id
    return _row(ident, job["state"], f"{round(100 * (job.get('progress') or 0))}%",
                job.get("tier") or "", gpus_of(job), when(job.get("created_at")),
                when(job.get("started_at")), duration(job), nodes_of(job), f"{job['name']}{index}")  # fmt: skip


def gpus_of(job: dict) -> str:
    gpus, nodes = job.get("gpus", 0), job.get("nodes") or 1
    return f"{gpus}x{nodes}" if nodes > 1 else str(gpus)


def nodes_of(job: dict, *, every: bool = False) -> str:
    """The nodes of the job's last attempt: the first (`+N` more for a gang), or all of them."""
    attempts = job.get("attempts") or []
    names = [p["node"] for p in attempts[-1].get("placements", [])] if attempts else []
    if not names:
        return "-"
    if every:
        return ", ".join(names)
    return names[0] + (f"+{len(names) - 1}" if len(names) > 1 else "")


def parse_time(text: str | None) -> datetime.datetime | None:
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def when(text: str | None, fmt: str = "%m-%d %H:%M") -> str:
    """An API time in the local time zone, short."""
    moment = parse_time(text)
    return moment.astimezone().strftime(fmt) if moment else "-"


def duration(job: dict) -> str:
    """How long it ran: start to end, or to now while it runs; `-` before it started."""
    started = parse_time(job.get("started_at"))
    if started is None:
        return "-"
    ended = parse_time(job.get("finished_at"))
    if ended is None:
        if job.get("state") not in RUNNING:
            return "-"
        ended = datetime.datetime.now(datetime.UTC)
    return span(max(0.0, (ended - started).total_seconds()))


def span(seconds: float) -> str:
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def _maybe_array(client: Client, array_id: str) -> dict | None:
    try:
        return client.array(array_id)
    except ApiError:
        return None


def state_order(counts: dict) -> list[str]:
    return sorted(counts, key=lambda s: (STATES.index(s) if s in STATES else len(STATES), s))


def array_line(array: dict) -> str:
    counts = array.get("counts") or {}
    done = sum(counts.get(s, 0) for s in TERMINAL)
    throttle = f" %{array['throttle']}" if array.get("throttle") else ""
    states = ", ".join(f"{counts[state]} {state}" for state in state_order(counts) if counts[state])
    return f"{array['id']}  array      {done}/{array.get('size', '?')} done{throttle}  ({states or 'no tasks yet'})"


def job_or_array(client: Client, ident: str, job_call, array_call):
    """Try `ident` as a job, then (on 404) as an array; the job's 404 if neither."""
    try:
        return "job", job_call(ident)
    except ApiError as error:
        if error.status != 404:
            raise
        first = error
    try:
        return "array", array_call(ident)
    except ApiError as error:
        if error.status != 404:
            raise
    raise first


def cmd_show(client: Client, args) -> int:
    kind, obj = job_or_array(client, args.job_id, client.get, client.array)
    if args.json:
        print(json.dumps(obj, indent=2))
        return 0
    if kind == "array":
        print(array_line(obj))
        counts = obj.get("counts") or {}
        for state in state_order(counts):
            print(f"  {state:<10} {counts[state]}")
        print(f"tasks: gpuplatform list --array {obj['id']}")
        return 0
    for line in job_lines(obj):
        print(line)
    return 0


def job_lines(job: dict) -> list[str]:
    full = "%Y-%m-%d %H:%M:%S"
    nodes = job.get("nodes") or 1
    lines = [
        f"{job['id']}  {job['name']}",
        f"state {job['state']}  progress {round(100 * (job.get('progress') or 0))}%",
        f"tier {job.get('tier')}  gpus {job.get('gpus')} x {nodes} node{'s' if nodes > 1 else ''}"
        + (f"  sku {job['gpu_sku']}" if job.get("gpu_sku") else ""),
        f"submitted {when(job.get('created_at'), full)}  started {when(job.get('started_at'), full)}"
        f"  finished {when(job.get('finished_at'), full)}  duration {duration(job)}",
        f"node {nodes_of(job, every=True)}",
    ]
    if job.get("array"):
        lines.append(f"array {job['array']} index {job.get('array_index')}")
    if job.get("bundle"):
        lines.append(f"bundle {job['bundle'][:12]}")
    if job.get("queue_position"):
        lines.append(f"queue position {job['queue_position']}")
    if job.get("reason"):
        lines.append(f"reason: {job['reason']}")
    for attempt in job.get("attempts") or []:
        where = ", ".join(f"{p['node']}:{p['gpu_indices']}" for p in attempt["placements"])
        lines.append(
            f"  attempt {attempt['number']} {attempt['state']} on {where} exit={attempt['exit_code']}"
        )
    return lines


# --- cancel and results --------------------------------------------------------------------------


def cmd_cancel(client: Client, args) -> int:
    kind, obj = job_or_array(client, args.job_id, client.cancel, client.cancel_array)
    if kind == "array":
        _out(
            args,
            obj,
            f"{obj.get('id', args.job_id)} cancelled"
            + (f": {array_line(obj)}" if "counts" in obj else ""),
        )
        return 0
    _out(args, obj, f"{obj['id']} {obj['state']}")
    return 0


def cmd_artifacts(client: Client, args) -> int:
    kind, found = job_or_array(client, args.job_id, client.artifacts, client.array)
    if kind == "array":
        return _array_artifacts(client, found, args)
    if args.download:
        for artifact in found:
            print(client.download(args.job_id, artifact["name"], args.download))
        return 0
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    for artifact in found:
        print(f"{artifact['size']:>10}  {artifact['name']}")
    return 0


def _array_artifacts(client: Client, array: dict, args) -> int:
    """Each task's results, in index order (`--download DIR`: into DIR/<index>/)."""
    results = {}
    for task in client.tasks(array["id"]):
        index, ident = task.get("array_index"), task.get("id")
        found = client.artifacts(ident) if ident else []  # a task never made has no id
        results[str(index)] = {"job": ident, "state": task["state"], "artifacts": found}
        if args.json:
            continue
        print(f"[{index}] {ident or '(never made)'} {task['state']}")
        for artifact in found:
            if args.download and ident:
                target = os.path.join(args.download, str(index))
                print(f"  {client.download(ident, artifact['name'], target)}")
            else:
                print(f"  {artifact['size']:>10}  {artifact['name']}")
        if not found:
            print("  (no results)")
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


# --- what there is to run on ---------------------------------------------------------------------


def cmd_templates(client: Client, args) -> int:
    templates = client.templates()
    if args.json:
        print(json.dumps(templates, indent=2))
        return 0
    for template in templates:
        print(f"{template['name']:<16} {template.get('description') or ''}")
        params = template.get("params") or {}
        if params:
            print(f"{'':<16} params: {', '.join(_param(n, s) for n, s in params.items())}")
    print("run one: gpuplatform submit --template NAME -p NAME=VALUE ...")
    return 0


def _param(name: str, spec: dict) -> str:
    bounds = ""
    if "minimum" in spec or "maximum" in spec:
        bounds = f" {spec.get('minimum', '')}..{spec.get('maximum', '')}"
    default = f"={spec['default']}" if "default" in spec else ""
    needed = ", required" if spec.get("required") else ""
    return f"{name}{default} ({spec.get('type', 'any')}{bounds}{needed})"


def cmd_nodes(client: Client, args) -> int:
    skus = client.capacity()
    if args.json:
        print(json.dumps(skus, indent=2))
        return 0
    print(
        f"{'SKU':<16} {'NODES':>5} {'GPUS':>5} {'FREE':>5} {'MOST FREE ON A NODE':>20} {'UNAVAILABLE NODES':>18}"
    )
    for sku in skus:
        print(f"{sku['sku']:<16} {sku['nodes']:>5} {sku['gpus']:>5} {sku['free']:>5} "
              f"{sku['most_free_on_one_node']:>20} {sku['unavailable_nodes']:>18}")  # fmt: skip
    if not skus:
        print("(no nodes yet)")
    return 0


def _out(args, data: dict, text: str) -> None:
    print(json.dumps(data, indent=2) if args.json else text, flush=True)
