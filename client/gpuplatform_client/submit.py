"""`gpuplatform submit`: the submit body from the options, the working directory packed and
uploaded when it is new, and the job's name from its script or directory."""

from __future__ import annotations

import json
import os
import sys
import urllib.error

from . import pack
from .api import ApiError, Client, ConfigError
from .follow import follow_array, follow_job
from .views import array_line

CONDITIONS = ("afterok", "afterany", "afternotok", "aftercorr")
# What runs a script rather than being one: the job's name skips these to the script.
LAUNCHERS = {"python", "pypy", "torchrun", "accelerate", "deepspeed", "uv", "uvx",
             "poetry", "pipenv", "bash", "sh", "env", "mpirun", "srun", "launch", "run", "exec"}  # fmt: skip


def submit_body(args, client: Client | None = None) -> dict:
    """The submit body the options ask for (without the bundle: `cmd_submit` adds it)."""
    argv = args.argv if args.argv is not None else None
    if args.trailing:
        if args.template or args.argv is not None:
            raise ConfigError(
                "give the command after `--`, or --command, or --template: one of them"
            )
        argv = args.trailing
    image = getattr(args, "image", None)
    if not args.template and not argv and not image:
        raise ConfigError("submit wants a command (after `--`), --template NAME or --image REF")
    if argv is not None and not argv:
        raise ConfigError("--command wants an argv")
    if args.workdir and args.template:
        raise ConfigError(
            "--workdir runs a command from the directory; it does not go with --template"
        )
    body: dict = {"template": args.template} if args.template else {"command": argv}
    if image:  # docs/images.md: without a command the image's own Cmd runs
        body["image"] = image
        if not argv and not args.template:
            del body["command"]
    if getattr(args, "image_pull_secret", None):
        body["image_pull_secret"] = args.image_pull_secret
    if args.param:
        body["params"] = dict(_pair(p, "--param", parse=True) for p in args.param)
    if args.name is None and argv:
        name = job_name(argv, args.workdir)
        if name:
            body["name"] = name
    for key in ("gpus", "nodes", "gpu_sku", "name", "tier", "max_runtime_seconds"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    if args.env:
        body["env"] = dict(_pair(p, "--env") for p in args.env)
    if args.secret:
        body["secrets"] = list(dict.fromkeys(args.secret))
    requirements = _requirements(args)
    if requirements is not None:
        body["python"] = {"requirements": requirements}
    if args.array:
        body["array"] = args.array
        if args.array_params:
            params = _json_file(args.array_params, "--array-params")
            if not isinstance(params, list):
                raise ConfigError(f"--array-params: {args.array_params} should hold a JSON list")
            body["array_params"] = params
        if args.array_grid:
            grid = _json_file(args.array_grid, "--array-grid")
            if not isinstance(grid, dict):
                raise ConfigError(f"--array-grid: {args.array_grid} should hold a JSON object")
            body["array_grid"] = grid
    elif args.array_params or args.array_grid:
        raise ConfigError("--array-params and --array-grid go with --array")
    if args.depends_on:
        body["depends_on"] = [_dependency(text, client) for text in args.depends_on]
    return body


def cmd_submit(client: Client, args) -> int:
    body = submit_body(args, client)
    if args.workdir:
        body["bundle"] = upload_workdir(client, args.workdir)
    result = client.submit(idempotency_key=args.idempotency_key, **body)
    if args.array:
        _out(args, result, array_line(result))
        if args.wait:
            return follow_array(client, result["id"], as_json=args.json)
        return 0
    _out(args, result, f"{result['id']} {result['state']} {result['name']}")
    if args.wait:
        return follow_job(client, result["id"], quiet=False, timeout=None, as_json=args.json)
    return 0


def job_name(argv: list[str], workdir: str | None) -> str | None:
    """A name for a command job: its script (`python train.py` -> `train`, `torchrun ... train.py`
    likewise, `python -m pkg.main` -> `pkg.main`), else the working directory's name; None leaves
    it to the server."""
    words = iter(argv)
    for word in words:
        if word in ("-m", "-c"):
            module = next(words, None)
            return module if word == "-m" and module else _dir_name(workdir)
        if word.startswith("-") or "=" in word:
            continue
        base = word.rstrip("/").rsplit("/", 1)[-1]
        stem, dot, suffix = base.rpartition(".")
        if dot and suffix in ("py", "sh") and stem:
            return stem
        if base.isdigit() or base.rstrip("0123456789.") in LAUNCHERS:
            continue
        return base
    return _dir_name(workdir)


def _dir_name(workdir: str | None) -> str | None:
    return os.path.basename(os.path.abspath(workdir)) or None if workdir else None


def upload_workdir(client: Client, workdir: str) -> str:
    """Pack `workdir`, upload it unless the tenant already has that digest; its sha256."""
    err = sys.stderr
    bundle = pack.pack(workdir)
    try:
        print(f"bundle {bundle.sha256[:12]}: {bundle.files} files, {pack.human(bundle.unpacked_size)}"
              f" ({pack.human(bundle.size)} packed) from {workdir}", file=err, flush=True)  # fmt: skip
        for name in bundle.skipped:
            print(f"  skipped {name} (not a file, directory or link)", file=err)
        if client.bundle_exists(bundle.sha256):
            print(f"bundle {bundle.sha256[:12]} already uploaded", file=err, flush=True)
            return bundle.sha256
        try:
            answer = client.upload_bundle(
                bundle.path, progress=_progress_printer(bundle.sha256, err)
            )
        except urllib.error.URLError as error:
            raise ConfigError(
                f"the upload of bundle {bundle.sha256[:12]} ({pack.human(bundle.size)}) broke off: "
                f"{error.reason} (the server may have refused it as too large; a .gpuignore "
                f"can leave data and outputs out)"
            ) from None
        except ApiError as error:
            if error.status == 413:  # the error itself is printed once, by the caller
                print(f"gpuplatform: bundle {bundle.sha256[:12]} is {pack.human(bundle.size)}, over "
                      f"the server's cap; leave large files out with {pack.IGNORE_FILE} in {workdir}",
                      file=err)  # fmt: skip
            raise
        if answer and answer.get("sha256") and answer["sha256"] != bundle.sha256:
            raise ConfigError(
                f"the server stored the bundle as {answer['sha256']}, not {bundle.sha256}"
            )
        return bundle.sha256
    finally:
        bundle.path.unlink(missing_ok=True)


def _progress_printer(sha256: str, err):
    tty = err.isatty()
    shown = {"step": -1}

    def show(sent: int, total: int) -> None:
        percent = 100 if total == 0 else sent * 100 // total
        step = percent if tty else percent // 25  # a terminal: every percent; a log: every 25%
        if step == shown["step"]:
            return
        shown["step"] = step
        text = f"uploading bundle {sha256[:12]}: {percent:3d}% ({pack.human(sent)} of {pack.human(total)})"
        if tty:
            print("\r" + text, end="\n" if sent >= total else "", file=err, flush=True)
        else:
            print(text, file=err, flush=True)

    return show


def _pair(text: str, option: str, *, parse: bool = False) -> tuple[str, object]:
    name, sep, raw = text.partition("=")
    if not sep or not name:
        raise ConfigError(f"{option} wants NAME=VALUE, got {text!r}")
    if not parse:
        return name, raw
    try:
        return name, json.loads(raw)
    except ValueError:
        return name, raw


def _requirements(args) -> list[str] | None:
    if args.requirement_specs:
        return list(args.requirement_specs)
    if not args.requirements:
        return None
    try:
        text = open(args.requirements, encoding="utf-8").read()
    except OSError as error:
        raise ConfigError(f"--requirements: {error}") from None
    out = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            raise ConfigError(
                f"--requirements {args.requirements}:{number}: {line!r}: options (-r, -e, "
                f"--index-url...) are the node operator's; list requirements only"
            )
        out.append(line)
    return out


def _out(args, data: dict, text: str) -> None:
    print(json.dumps(data, indent=2) if args.json else text, flush=True)


def _json_file(path: str, option: str):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError) as error:
        raise ConfigError(f"{option}: {path}: {error}") from None


def _dependency(text: str, client: Client | None) -> dict:
    """`[COND:][job:|array:]ID` -> `{"job"|"array": ID, "condition": COND}`. Without `job:` or
    `array:` the API says which it is (a job first; `aftercorr` is always an array)."""
    condition, kind = "afterok", None
    parts = text.split(":")
    if len(parts) > 1 and parts[0] in CONDITIONS:
        condition, parts = parts[0], parts[1:]
    if len(parts) > 1 and parts[0] in ("job", "array"):
        kind, parts = parts[0], parts[1:]
    if len(parts) != 1 or not parts[0]:
        raise ConfigError(
            f"--depends-on wants [COND:][job:|array:]ID with COND one of {', '.join(CONDITIONS)}, got {text!r}"
        )
    target = parts[0]
    if kind is None and condition == "aftercorr":
        kind = "array"
    kind, target = _whole_id(client, kind, target)
    return {kind: target, "condition": condition}


def _whole_id(client: Client | None, kind: str | None, target: str) -> tuple[str, str]:
    """(job or array, its whole id): the API says which `target` is (a job first) and completes
    an id prefix, which the submit body does not take. Neither: as given, for the submit's 404."""
    if client is None:
        return kind or "job", target
    for each, read in (("job", client.get), ("array", client.array)):
        if kind not in (None, each):
            continue
        try:
            return each, read(target)["id"]
        except ApiError as error:
            if error.status != 404:
                raise
    return kind or "job", target
