"""`gpuplatform submit|list|show|logs|cancel|wait|artifacts|secrets`: the public API from a shell
(also `python -m gpuplatform_client`, and `python -m gpuplatform.cli` in the platform's repo).
The token comes from `--token`, `GPUPLATFORM_TOKEN` or the config file (see api.py); the URL
likewise from `--url`, `GPUPLATFORM_URL` or the config file.

    gpuplatform submit --workdir . --gpus 2 --env LR=3e-4 --secret HF_TOKEN --wait -- python train.py
    gpuplatform submit --workdir . --array 0-99%8 --array-grid grid.json -- python train.py
    gpuplatform secrets set HF_TOKEN < token.txt

Exit status: 0 done (for `wait`, and `submit --wait`: the job, or every task of the array,
succeeded); for a job that failed with an exit status of its own, that status; 1 the job
failed otherwise or was cancelled; 2 bad usage or configuration (or a working directory that
cannot be packed); 3 the API refused the request.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import urllib.error

from . import interactive, pack
from .api import TERMINAL, ApiError, Client, ConfigError, Event, load_settings

CONDITIONS = ("afterok", "afterany", "afternotok", "aftercorr")
STATES = ("queued", "starting", "running", "preempting", "succeeded", "failed", "cancelled")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    argv, command = _split_command(argv)
    args = parser().parse_args(argv)
    if args.command in ("submit", "exec"):
        args.trailing = command
    elif command:
        parser().error("`-- COMMAND...` only goes with submit and exec")
    try:
        client = _client(args)
        return args.run(client, args)
    except ConfigError as error:
        print(f"gpuplatform: {error}", file=sys.stderr)
        return 2
    except pack.PackError as error:
        print(f"gpuplatform: cannot pack the working directory: {error}", file=sys.stderr)
        return 2
    except ApiError as error:
        print(
            f"gpuplatform: the API answered {error.status}: {_brief(error.body)}", file=sys.stderr
        )
        for line in _field_errors(error.body):
            print(f"gpuplatform:   {line}", file=sys.stderr)
        if error.retry_after:
            print(f"gpuplatform: retry after {error.retry_after} s", file=sys.stderr)
        return 3
    except urllib.error.URLError as error:
        print(f"gpuplatform: cannot reach {args.url or load_settings(args.profile)[0]}: "
              f"{error.reason}", file=sys.stderr)  # fmt: skip
        return 3
    except KeyboardInterrupt:
        return 130


def console() -> None:
    """The `gpuplatform` console script."""
    sys.exit(main())


def _split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """`submit ... -- python train.py`: what follows the first `--` is the job's argv (unless
    `--command` came first: that one takes the rest of the line, `--` included, as before)."""
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    if "--command" in argv[:cut]:
        return argv, []
    return argv[:cut], argv[cut + 1 :]


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="gpuplatform", description="Submit and follow GPU jobs.")
    top.add_argument("--url", help="platform URL (default: $GPUPLATFORM_URL or the config file)")
    top.add_argument("--token", help="API token (default: $GPUPLATFORM_TOKEN or the config file)")
    top.add_argument("--profile", default="default", help="config file section")
    top.add_argument("--json", action="store_true", help="print the API's JSON")
    commands = top.add_subparsers(dest="command", required=True)

    submit = commands.add_parser(
        "submit", help="submit a job (or an array of them)",
        usage="gpuplatform submit (--template NAME | [--workdir DIR] [options] -- COMMAND ...)",
    )  # fmt: skip
    what = submit.add_mutually_exclusive_group()
    what.add_argument("--template", "-t")
    what.add_argument("--command", nargs=argparse.REMAINDER, dest="argv",
                      help="argv, last option (or put the command after `--`)")  # fmt: skip
    submit.add_argument("--param", "-p", action="append", default=[], metavar="NAME=VALUE",
                        help="template parameter; VALUE is JSON if it parses (5, 0.1, true), else a string")  # fmt: skip
    submit.add_argument("--workdir", "-w", metavar="DIR",
                        help="pack DIR (honouring its .gpuignore), upload it if new, run the command in it")  # fmt: skip
    submit.add_argument("--gpus", type=int)
    submit.add_argument("--nodes", type=int)
    submit.add_argument("--sku", dest="gpu_sku")
    submit.add_argument("--name")
    submit.add_argument("--tier")
    submit.add_argument("--max-runtime", type=int, dest="max_runtime_seconds")
    submit.add_argument("--idempotency-key")
    submit.add_argument("--env", "-e", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable for the job (repeatable)")  # fmt: skip
    submit.add_argument("--secret", "-s", action="append", default=[], metavar="NAME",
                        help="a tenant secret to set in the job's environment (repeatable)")  # fmt: skip
    reqs = submit.add_mutually_exclusive_group()
    reqs.add_argument("--requirements", "-r", metavar="FILE",
                      help="a requirements.txt for the job's Python environment "
                           "(a requirements.txt at the workdir's root is used without this)")  # fmt: skip
    reqs.add_argument("--requirement", action="append", default=[], metavar="SPEC", dest="requirement_specs",
                      help="one requirement (repeatable), e.g. 'numpy==2.1.0'")  # fmt: skip
    submit.add_argument(
        "--array", metavar="SPEC", help="a job array, Slurm's syntax: 0-99%%8, 0-9:2, 1,5,9"
    )
    grid = submit.add_mutually_exclusive_group()
    grid.add_argument(
        "--array-params", metavar="FILE.json", help="a JSON list: one params object per index"
    )
    grid.add_argument(
        "--array-grid", metavar="FILE.json", help='a JSON object {"lr": [...], "batch": [...]}'
    )
    submit.add_argument("--depends-on", action="append", default=[], metavar="[COND:]ID",
                        help="run after job or array ID (COND: afterok (default), afterany, afternotok, "
                             "aftercorr; `array:ID` or `job:ID` to say which it is)")  # fmt: skip
    submit.add_argument("--wait", action="store_true", help="then follow it until it ends")
    submit.set_defaults(run=cmd_submit, trailing=[])

    listing = commands.add_parser(
        "list", help="your tenant's jobs, newest first (an array is one row)"
    )
    listing.add_argument("--state")
    listing.add_argument("--tier")
    listing.add_argument("--page", type=int)
    listing.add_argument("--array", metavar="ID", help="the tasks of this array")
    listing.set_defaults(run=cmd_list)

    for name, run, text in [("show", cmd_show, "one job or array"), ("logs", cmd_logs, "a job's output"),
                            ("cancel", cmd_cancel, "cancel a job, or every task of an array"),
                            ("wait", cmd_wait, "follow a job until it ends"),
                            ("artifacts", cmd_artifacts, "list or download a job's result files")]:  # fmt: skip
        command = commands.add_parser(name, help=text)
        command.add_argument("job_id", metavar="ID")
        command.set_defaults(run=run)
        if name == "wait":
            command.add_argument("--timeout", type=float, help="give up after this many seconds")
            command.add_argument(
                "--quiet", "-q", action="store_true", help="print only the final state"
            )
        if name == "artifacts":
            command.add_argument("--download", metavar="DIR", help="save every artifact into DIR")

    interactive.register(commands)  # shell, exec, port-forward (interactive.py)

    secrets = commands.add_parser("secrets", help="your tenant's secrets (values are write-only)")
    actions = secrets.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="names and dates").set_defaults(run=cmd_secrets_list)
    setting = actions.add_parser(
        "set", help="create or replace one (the value from stdin or --from-file)"
    )
    setting.add_argument("name")
    setting.add_argument("--from-file", metavar="FILE", help="the value is this file's content")
    setting.set_defaults(run=cmd_secrets_set)
    deleting = actions.add_parser("delete", help="delete one")
    deleting.add_argument("name")
    deleting.set_defaults(run=cmd_secrets_delete)
    return top


def _client(args) -> Client:
    url, token = load_settings(args.profile)
    token = args.token or token
    if not token:
        raise ConfigError(
            "no API token: use --token, set GPUPLATFORM_TOKEN or write the config file"
        )
    return Client(args.url or url, token)


# --- submit ---------------------------------------------------------------------------------


def submit_body(args, client: Client | None = None) -> dict:
    """The submit body the options ask for (without the bundle: `cmd_submit` adds it)."""
    argv = args.argv if args.argv is not None else None
    if args.trailing:
        if args.template or args.argv is not None:
            raise ConfigError(
                "give the command after `--`, or --command, or --template: one of them"
            )
        argv = args.trailing
    if not args.template and not argv:
        raise ConfigError("submit wants a command (after `--`) or --template NAME")
    if argv is not None and not argv:
        raise ConfigError("--command wants an argv")
    if args.workdir and args.template:
        raise ConfigError(
            "--workdir runs a command from the directory; it does not go with --template"
        )
    body: dict = {"template": args.template} if args.template else {"command": argv}
    if args.param:
        body["params"] = dict(_pair(p, "--param", parse=True) for p in args.param)
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
        _out(args, result, _array_line(result))
        if args.wait:
            return _follow_array(client, result["id"], as_json=args.json)
        return 0
    _out(args, result, f"{result['id']} {result['state']} {result['name']}")
    if args.wait:
        return _follow(client, result["id"], quiet=False, timeout=None, as_json=args.json)
    return 0


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
            if error.status == 413:
                print(f"gpuplatform: bundle {bundle.sha256[:12]} is {pack.human(bundle.size)}, over "
                      f"the server's cap: {_brief(error.body)}", file=err)  # fmt: skip
                print(
                    f"gpuplatform: leave large files out with {pack.IGNORE_FILE} in {workdir}",
                    file=err,
                )
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
    if kind is None:
        kind = "array" if condition == "aftercorr" else _kind_of(client, target)
    return {kind: target, "condition": condition}


def _kind_of(client: Client | None, target: str) -> str:
    if client is None:
        return "job"
    try:
        client.get(target)
        return "job"
    except ApiError as error:
        if error.status != 404:
            raise
    try:
        client.array(target)
        return "array"
    except ApiError as error:
        if error.status != 404:
            raise
    return "job"  # neither: the submit's 404 (or 400) will name it


# --- the other commands ---------------------------------------------------------------------


def cmd_list(client: Client, args) -> int:
    page = client.list(state=args.state, tier=args.tier, page=args.page, array=args.array)
    if args.json:
        print(json.dumps(page, indent=2))
        return 0
    arrays: dict[str, dict | None] = {}
    for job in page["results"]:
        array_id = job.get("array")
        if array_id and not args.array:  # one row per array, where its first task is
            if array_id not in arrays:
                array = arrays[array_id] = _maybe_array(client, array_id)
                if array is not None:
                    print(_array_line(array))
            if arrays[array_id] is not None:
                continue
        index = f"[{job['array_index']}]" if job.get("array_index") is not None else ""
        print(f"{job['id']}  {job['state']:<10} {round(100 * job['progress']):>3}%  "
              f"{job['tier']:<10} {job['name']}{index}")  # fmt: skip
    if page.get("next"):
        print(f"... {page['count']} in all; --page for more")
    return 0


def _maybe_array(client: Client, array_id: str) -> dict | None:
    try:
        return client.array(array_id)
    except ApiError:
        return None


def _array_line(array: dict) -> str:
    counts = array.get("counts") or {}
    done = sum(counts.get(s, 0) for s in TERMINAL)
    throttle = f" %{array['throttle']}" if array.get("throttle") else ""
    order = sorted(counts, key=lambda s: (STATES.index(s) if s in STATES else len(STATES), s))
    states = ", ".join(f"{counts[state]} {state}" for state in order if counts[state])
    return f"{array['id']}  array      {done}/{array.get('size', '?')} done{throttle}  ({states or 'no tasks yet'})"


def _job_or_array(client: Client, ident: str, job_call, array_call):
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
    kind, obj = _job_or_array(client, args.job_id, client.get, client.array)
    if args.json:
        print(json.dumps(obj, indent=2))
        return 0
    if kind == "array":
        print(_array_line(obj))
        counts = obj.get("counts") or {}
        for state in sorted(
            counts, key=lambda s: (STATES.index(s) if s in STATES else len(STATES), s)
        ):
            print(f"  {state:<10} {counts[state]}")
        print(f"tasks: gpuplatform list --array {obj['id']}")
        return 0
    job = obj
    print(
        f"{job['id']}  {job['name']}\nstate {job['state']}  progress {round(100 * job['progress'])}%"
    )
    if job.get("array"):
        print(f"array {job['array']} index {job.get('array_index')}")
    if job.get("bundle"):
        print(f"bundle {job['bundle'][:12]}")
    if job.get("queue_position"):
        print(f"queue position {job['queue_position']}")
    if job.get("reason"):
        print(f"reason: {job['reason']}")
    for attempt in job["attempts"]:
        where = ", ".join(f"{p['node']}:{p['gpu_indices']}" for p in attempt["placements"])
        print(
            f"  attempt {attempt['number']} {attempt['state']} on {where} exit={attempt['exit_code']}"
        )
    return 0


def cmd_logs(client: Client, args) -> int:
    sys.stdout.write(client.logs(args.job_id))
    return 0


def cmd_cancel(client: Client, args) -> int:
    kind, obj = _job_or_array(client, args.job_id, client.cancel, client.cancel_array)
    if kind == "array":
        _out(
            args,
            obj,
            f"{obj.get('id', args.job_id)} cancelled"
            + (f": {_array_line(obj)}" if "counts" in obj else ""),
        )
        return 0
    _out(args, obj, f"{obj['id']} {obj['state']}")
    return 0


def cmd_wait(client: Client, args) -> int:
    return _follow(client, args.job_id, quiet=args.quiet, timeout=args.timeout, as_json=args.json)


def job_status(job: dict) -> int:
    """The exit status for a finished job: 0 succeeded; the job's own status if it failed with
    one; 1 otherwise (cancelled, or failed without one)."""
    if job["state"] == "succeeded":
        return 0
    code = job.get("exit_code")
    if job["state"] == "failed" and isinstance(code, int) and 0 < code < 256:
        return code
    return 1


def _follow(
    client: Client, job_id: str, *, quiet: bool, timeout: float | None, as_json: bool
) -> int:
    def show(event: Event) -> None:
        if quiet:
            return
        if event.event == "state":
            reason = f" ({event.data['reason']})" if event.data.get("reason") else ""
            print(f"[{event.data['at'][11:19]}] {event.data['to']}{reason}", flush=True)
        elif event.event == "log":
            print(f"  | {event.data['line']}", flush=True)
        elif event.event == "progress":
            print(f"  progress {round(100 * event.data['progress'])}%", flush=True)

    try:
        job = client.wait(job_id, timeout=timeout, on_event=show)
    except TimeoutError as error:
        print(f"gpuplatform: {error}", file=sys.stderr)
        return 1
    _out(
        as_json,
        job,
        f"{job['id']} {job['state']}"
        + (f" exit={job['exit_code']}" if job["exit_code"] is not None else ""),
    )
    return job_status(job)


def _follow_array(client: Client, array_id: str, *, as_json: bool) -> int:
    array = client.wait_array(
        array_id, on_change=None if as_json else lambda a: print(_array_line(a), flush=True)
    )
    if as_json:
        print(json.dumps(array, indent=2))
    counts = array.get("counts") or {}
    return 0 if counts.get("succeeded", 0) == array.get("size") else 1


def cmd_artifacts(client: Client, args) -> int:
    artifacts = client.artifacts(args.job_id)
    if args.download:
        for artifact in artifacts:
            path = client.download(args.job_id, artifact["name"], args.download)
            print(path)
        return 0
    if args.json:
        print(json.dumps(artifacts, indent=2))
        return 0
    for artifact in artifacts:
        print(f"{artifact['size']:>10}  {artifact['name']}")
    return 0


def cmd_secrets_list(client: Client, args) -> int:
    secrets = client.secrets()
    if args.json:
        print(json.dumps(secrets, indent=2))
        return 0
    for secret in secrets:
        print(
            f"{secret['name']:<32} updated {secret.get('updated_at') or secret.get('created_at') or ''}"
        )
    return 0


def cmd_secrets_set(client: Client, args) -> int:
    if args.from_file:
        try:
            with open(args.from_file, encoding="utf-8") as handle:
                value = handle.read()
        except OSError as error:
            raise ConfigError(f"--from-file: {error}") from None
    elif sys.stdin.isatty():
        value = getpass.getpass(f"value of {args.name} (not echoed): ")
    else:
        value = sys.stdin.read()
        value = value[:-1] if value.endswith("\n") else value  # `echo x |` adds one
        value = value[:-1] if value.endswith("\r") else value
    if not value:
        raise ConfigError(f"no value for secret {args.name} (give it on stdin or with --from-file)")
    secret = client.set_secret(args.name, value)
    _out(args, secret or {"name": args.name}, f"secret {args.name} set")
    return 0


def cmd_secrets_delete(client: Client, args) -> int:
    client.delete_secret(args.name)
    _out(args, {"name": args.name, "deleted": True}, f"secret {args.name} deleted")
    return 0


def _out(args_or_json, data: dict, text: str) -> None:
    as_json = args_or_json if isinstance(args_or_json, bool) else args_or_json.json
    print(json.dumps(data, indent=2) if as_json else text, flush=True)


def _brief(body) -> str:
    return json.dumps(body) if isinstance(body, dict | list) else str(body)[:500]


def _field_errors(body, prefix: str = "") -> list[str]:
    """`{"env": {"PATH": ["reserved"]}}` -> `["env.PATH: reserved"]`: one line per field."""
    if not isinstance(body, dict) or (not prefix and set(body) <= {"detail"}):
        return []  # not per field: the first line said it all
    lines = []
    for key, value in body.items():
        field = f"{prefix}{key}"
        if isinstance(value, dict):
            lines += _field_errors(value, field + ".")
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for i, item in enumerate(value):
                lines += _field_errors(item, f"{field}[{i}].")
        elif isinstance(value, list):
            lines.append(f"{field}: {' '.join(str(v) for v in value)}")
        else:
            lines.append(f"{field}: {value}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
