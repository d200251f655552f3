"""A job's inputs (docs/pipelines.md): before a job with dependencies starts, the agent downloads
the artifacts of its parents through the member's inputs endpoint of the agent API (the node
credential and the attempt's token, as every member request; the job never holds either) into
`GPUPLATFORM_INPUT_DIR`, one directory per parent job, and writes `inputs.json` there, which
the job's SDK reads (`gpuplatform_job.inputs()`, `read_input(job_id, name)`)."""

from __future__ import annotations

import json
import pathlib

from apps.platform.agent_protocol import Assignment

MANIFEST = "inputs.json"


def _safe(name: str) -> bool:
    parts = name.split("/")
    return (
        bool(name)
        and "\\" not in name
        and "\0" not in name
        and all(p not in ("", ".", "..") for p in parts)
    )


def fetch(api, a: Assignment, dest: pathlib.Path) -> list[dict]:
    """Download every input of `a`'s job into `dest`/<job id>/<name>; returns the manifest's
    entries (each with the file's `path` relative to `dest`). Raises the API's errors: a job
    must not start without the inputs it asked for."""
    dest.mkdir(parents=True, exist_ok=True)
    entries = []
    for item in api.list_inputs(a):
        job_id, name = str(item["job"]), str(item["name"])
        if not _safe(name) or not _safe(job_id):
            continue  # the platform stores only safe names; never write outside dest
        relative = f"{job_id}/{name}"
        api.get_input(a, job_id, name, dest / relative)
        entries.append({**item, "path": relative})
    (dest / MANIFEST).write_text(json.dumps({"inputs": entries}, indent=1))
    return entries
