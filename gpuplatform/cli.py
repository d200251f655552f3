"""`python -m gpuplatform.cli submit|list|show|logs|cancel|wait|artifacts`: the public API from a
shell. The token comes from `--token`, `GPUPLATFORM_TOKEN` or the config file (see
gpuplatform/client.py); the URL likewise from `--url`, `GPUPLATFORM_URL` or the config file.

Exit status: 0 done (for `wait`, and `submit --wait`: the job succeeded), 1 the job failed or
was cancelled, 2 bad usage or configuration, 3 the API refused the request.
"""

from __future__ import annotations

import argparse
import json
import sys

from gpuplatform.client import ApiError, Client, ConfigError, Event, load_settings


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        client = _client(args)
        return args.run(client, args)
    except ConfigError as error:
        print(f"gpuplatform: {error}", file=sys.stderr)
        return 2
    except ApiError as error:
        print(
            f"gpuplatform: the API answered {error.status}: {_brief(error.body)}", file=sys.stderr
        )
        if error.retry_after:
            print(f"gpuplatform: retry after {error.retry_after} s", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        return 130


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="gpuplatform", description="Submit and follow GPU jobs.")
    top.add_argument("--url", help="platform URL (default: $GPUPLATFORM_URL or the config file)")
    top.add_argument("--token", help="API token (default: $GPUPLATFORM_TOKEN or the config file)")
    top.add_argument("--profile", default="default", help="config file section")
    top.add_argument("--json", action="store_true", help="print the API's JSON")
    commands = top.add_subparsers(dest="command", required=True)

    submit = commands.add_parser("submit", help="submit a job")
    what = submit.add_mutually_exclusive_group(required=True)
    what.add_argument("--template", "-t")
    what.add_argument("--command", nargs=argparse.REMAINDER, dest="argv", help="argv, last option")
    submit.add_argument("--param", "-p", action="append", default=[], metavar="NAME=VALUE",
                        help="template parameter; VALUE is JSON if it parses (5, 0.1, true), else a string")  # fmt: skip
    submit.add_argument("--gpus", type=int)
    submit.add_argument("--nodes", type=int)
    submit.add_argument("--sku", dest="gpu_sku")
    submit.add_argument("--name")
    submit.add_argument("--tier")
    submit.add_argument("--max-runtime", type=int, dest="max_runtime_seconds")
    submit.add_argument("--idempotency-key")
    submit.add_argument("--wait", action="store_true", help="then follow it until it ends")
    submit.set_defaults(run=cmd_submit)

    listing = commands.add_parser("list", help="your tenant's jobs, newest first")
    listing.add_argument("--state")
    listing.add_argument("--tier")
    listing.add_argument("--page", type=int)
    listing.set_defaults(run=cmd_list)

    for name, run, text in [("show", cmd_show, "one job"), ("logs", cmd_logs, "a job's output"),
                            ("cancel", cmd_cancel, "cancel a job"), ("wait", cmd_wait, "follow a job until it ends"),
                            ("artifacts", cmd_artifacts, "list or download a job's result files")]:  # fmt: skip
        command = commands.add_parser(name, help=text)
        command.add_argument("job_id")
        command.set_defaults(run=run)
        if name == "wait":
            command.add_argument("--timeout", type=float, help="give up after this many seconds")
            command.add_argument(
                "--quiet", "-q", action="store_true", help="print only the final state"
            )
        if name == "artifacts":
            command.add_argument("--download", metavar="DIR", help="save every artifact into DIR")
    return top


def _client(args) -> Client:
    url, token = load_settings(args.profile)
    token = args.token or token
    if not token:
        raise ConfigError(
            "no API token: use --token, set GPUPLATFORM_TOKEN or write the config file"
        )
    return Client(args.url or url, token)


# --- commands -------------------------------------------------------------------------------


def cmd_submit(client: Client, args) -> int:
    body = {"template": args.template} if args.template else {"command": args.argv}
    if args.param:
        body["params"] = dict(_param(p) for p in args.param)
    for key in ("gpus", "nodes", "gpu_sku", "name", "tier", "max_runtime_seconds"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    job = client.submit(idempotency_key=args.idempotency_key, **body)
    _out(args, job, f"{job['id']} {job['state']} {job['name']}")
    if args.wait:
        return _follow(client, job["id"], quiet=False, timeout=None, as_json=args.json)
    return 0


def _param(text: str) -> tuple[str, object]:
    name, sep, raw = text.partition("=")
    if not sep or not name:
        raise ConfigError(f"--param wants NAME=VALUE, got {text!r}")
    try:
        return name, json.loads(raw)
    except ValueError:
        return name, raw


def cmd_list(client: Client, args) -> int:
    page = client.list(state=args.state, tier=args.tier, page=args.page)
    if args.json:
        print(json.dumps(page, indent=2))
        return 0
    for job in page["results"]:
        print(
            f"{job['id']}  {job['state']:<10} {round(100 * job['progress']):>3}%  {job['tier']:<10} {job['name']}"
        )
    if page.get("next"):
        print(f"... {page['count']} in all; --page for more")
    return 0


def cmd_show(client: Client, args) -> int:
    job = client.get(args.job_id)
    if args.json:
        print(json.dumps(job, indent=2))
        return 0
    print(
        f"{job['id']}  {job['name']}\nstate {job['state']}  progress {round(100 * job['progress'])}%"
    )
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
    job = client.cancel(args.job_id)
    _out(args, job, f"{job['id']} {job['state']}")
    return 0


def cmd_wait(client: Client, args) -> int:
    return _follow(client, args.job_id, quiet=args.quiet, timeout=args.timeout, as_json=args.json)


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
    return 0 if job["state"] == "succeeded" else 1


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


def _out(args_or_json, data: dict, text: str) -> None:
    as_json = args_or_json if isinstance(args_or_json, bool) else args_or_json.json
    print(json.dumps(data, indent=2) if as_json else text, flush=True)


def _brief(body) -> str:
    return json.dumps(body) if isinstance(body, dict | list) else str(body)[:500]


if __name__ == "__main__":
    sys.exit(main())
