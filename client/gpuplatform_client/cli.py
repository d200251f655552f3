"""`gpuplatform submit|list|show|logs|cancel|wait|artifacts|templates|nodes|secrets`: the public
API from a shell (also `python -m gpuplatform_client`, and `python -m gpuplatform.cli` in the
platform's repo). The token comes from `--token`, `GPUPLATFORM_TOKEN` or the config file (see
api.py); the URL likewise from `--url`, `GPUPLATFORM_URL` or the config file.

    gpuplatform submit --workdir . --gpus 2 --env LR=3e-4 --secret HF_TOKEN --wait -- python train.py
    gpuplatform submit --workdir . --array 0-99%8 --array-grid grid.json -- python train.py
    gpuplatform secrets set HF_TOKEN < token.txt

This module holds the command line itself (options, usage errors with a hint, API errors printed
once); the commands live in submit.py, views.py, follow.py and tenant_secrets.py.

Exit status: 0 done (for `wait`, and `submit --wait`: the job, or every task of the array,
succeeded); for a job that failed with an exit status of its own, that status; 1 the job
failed otherwise or was cancelled; 2 bad usage or configuration (or a working directory that
cannot be packed); 3 the API refused the request; 130 Ctrl-C (the job goes on).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import urllib.error

from . import __version__, interactive, pack
from .api import ApiError, Client, ConfigError, load_settings
from .follow import cmd_wait
from .submit import CONDITIONS, cmd_submit
from .tenant_secrets import cmd_secrets_delete, cmd_secrets_list, cmd_secrets_set
from .views import (
    STATES,
    cmd_artifacts,
    cmd_cancel,
    cmd_list,
    cmd_nodes,
    cmd_show,
    cmd_templates,
)

ID_HELP = "a job's id (or an array's), or a unique prefix of it of at least 8 characters"


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:  # `gpuplatform list | head`: the reader has all it wanted
        _stdout_to_devnull()
        return 141


def _main(argv: list[str]) -> int:
    argv, command = _split_command(argv)
    top = parser()
    args, extra = top.parse_known_args(argv)
    if extra:
        _unknown(top, args, extra)
    if args.command in ("submit", "exec"):
        args.trailing = command
    elif command:
        top.commands[args.command].error("`-- COMMAND...` only goes with submit and exec")
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
        report(error)
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


def _stdout_to_devnull() -> None:
    """Python's own advice for a closed pipe: point stdout at /dev/null, so that the flush at
    exit does not fail again (and print a traceback)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass  # not a real file (tests capture it)


def report(error: ApiError) -> None:
    """The API's refusal, each message once: per field (`env.PATH: reserved`), or its detail."""
    err = sys.stderr
    lines = _field_errors(error.body)
    if lines:
        print(f"gpuplatform: the API answered {error.status}:", file=err)
        for line in lines:
            print(f"gpuplatform:   {line}", file=err)
    else:
        print(f"gpuplatform: the API answered {error.status}: {_brief(error.body)}", file=err)
    if error.retry_after:
        print(f"gpuplatform: retry after {error.retry_after} s", file=err)


def _split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """`submit ... -- python train.py`: what follows the first `--` is the job's argv (unless
    `--command` came first: that one takes the rest of the line, `--` included, as before)."""
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    if "--command" in argv[:cut]:
        return argv, []
    return argv[:cut], argv[cut + 1 :]


# --- the options ----------------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    """Options only by their whole names (`--gpu` is not `--gpus`), and usage errors with a hint:
    the closest command, option or state to what was typed."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.commands: dict[str, Parser] = {}  # the top's: name -> its parser, for usage errors

    def error(self, message: str):
        self.print_usage(sys.stderr)
        hint = _hint(message)
        self.exit(
            2, f"{self.prog}: error: {message}\n" + (f"{self.prog}: {hint}\n" if hint else "")
        )


def _hint(message: str) -> str:
    """`invalid choice: 'runing' (choose from 'queued', ...)` -> `did you mean 'running'?`"""
    if "invalid choice: " not in message:
        return ""
    typed = message.split("invalid choice: ", 1)[1].split(" (choose", 1)[0].strip("'")
    choices = [c.strip(" '") for c in message.rsplit("(choose from ", 1)[-1].rstrip(")").split(",")]
    close = difflib.get_close_matches(typed, choices, n=1, cutoff=0.5)
    return f"did you mean {close[0]!r}?" if close else ""


def _unknown(top: Parser, args, extra: list[str]) -> None:
    """Words no option took: a usage error from the command's own parser, with a hint."""
    command = top.commands.get(args.command, top)
    if args.command == "secrets" and getattr(args, "action", None):
        command = top.commands.get(f"secrets {args.action}", command)
    first = extra[0]
    if not first.startswith("-"):
        if args.command in ("submit", "exec"):
            what, where = (
                ("the job's command", "[options]")
                if args.command == "submit"
                else ("the command", "ID")
            )
            command.error(f"unexpected {' '.join(extra)!r}: {what} goes after `--`, as in "
                          f"gpuplatform {args.command} {where} -- {' '.join(extra)}")  # fmt: skip
        command.error(f"unexpected argument(s): {' '.join(extra)}")
    name = first.split("=", 1)[0]
    options = [o for p in (command, top) for a in p._actions for o in a.option_strings]  # noqa: SLF001 (argparse has no public list)
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else f"; `{command.prog} --help` lists them"
    command.error(f"unknown option {name}{hint}")


def parser() -> Parser:
    top = Parser(prog="gpuplatform", description="Submit and follow GPU jobs.")
    top.add_argument("--version", action="version", version=f"gpuplatform {__version__}",
                     help="print the client's version and exit")  # fmt: skip
    top.add_argument("--url", help="platform URL (default: $GPUPLATFORM_URL or the config file)")
    top.add_argument("--token", help="API token (default: $GPUPLATFORM_TOKEN or the config file)")
    top.add_argument("--profile", default="default", help="config file section (default: default)")
    top.add_argument("--json", action="store_true", help="print the API's JSON")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                   help="what to do; `gpuplatform COMMAND --help` for its options")  # fmt: skip

    def add(name: str, **kwargs) -> Parser:
        top.commands[name] = commands.add_parser(name, **kwargs)
        return top.commands[name]

    _submit_options(add("submit", help="submit a job (or an array of them)",
                        usage="gpuplatform submit (--template NAME | [--workdir DIR] [options] -- COMMAND ...)"))  # fmt: skip

    listing = add("list", help="your tenant's jobs, newest first (an array is one row)")
    listing.add_argument(
        "--state", choices=STATES, help=f"only jobs in this state: {', '.join(STATES)}"
    )
    listing.add_argument("--tier", help="only jobs of this tier")
    listing.add_argument("--page", type=int, help="which page of 50 (default: 1, the newest)")
    listing.add_argument("--array", metavar="ID", help="the tasks of this array (" + ID_HELP + ")")
    listing.set_defaults(run=cmd_list)

    for name, run, text in [("show", cmd_show, "one job or array"), ("logs", cmd_logs, "a job's output"),
                            ("cancel", cmd_cancel, "cancel a job, or every task of an array"),
                            ("wait", cmd_wait, "follow a job (or an array) until it ends"),
                            ("artifacts", cmd_artifacts, "list or download a job's result files, "
                                                         "or each task's of an array")]:  # fmt: skip
        command = add(name, help=text)
        command.add_argument("job_id", metavar="ID", help=ID_HELP)
        command.set_defaults(run=run)
        if name == "wait":
            command.add_argument("--timeout", type=float, help="give up after this many seconds")
            command.add_argument(
                "--quiet", "-q", action="store_true", help="print only the final state"
            )
        if name == "artifacts":
            command.add_argument("--download", metavar="DIR",
                                 help="save every artifact into DIR (an array's: DIR/INDEX/)")  # fmt: skip
        if name == "logs":
            command.add_argument("--rank", type=int, metavar="N",
                                 help="gang member N's log (default 0, the leader)")  # fmt: skip
            command.add_argument("--attempt", type=int, metavar="N",
                                 help="only attempt N's log (default: every attempt's)")  # fmt: skip

    add("templates", help="the templates --template can run, with their parameters").set_defaults(
        run=cmd_templates
    )
    add("nodes", help="free GPUs per GPU model (SKU), now").set_defaults(run=cmd_nodes)
    interactive.register(add)  # shell, exec, port-forward (interactive.py)
    _secrets_commands(add("secrets", help="your tenant's secrets (values are write-only)"), top)
    return top


def _submit_options(submit: Parser) -> None:
    what = submit.add_mutually_exclusive_group()
    what.add_argument("--template", "-t", metavar="NAME",
                      help="run a built-in template (`gpuplatform templates` lists them)")  # fmt: skip
    what.add_argument("--command", nargs=argparse.REMAINDER, dest="argv",
                      help="argv, last option (or put the command after `--`)")  # fmt: skip
    submit.add_argument("--param", "-p", action="append", default=[], metavar="NAME=VALUE",
                        help="template parameter; VALUE is JSON if it parses (5, 0.1, true), else a string")  # fmt: skip
    submit.add_argument("--workdir", "-w", metavar="DIR",
                        help="pack DIR (honouring its .gpuignore), upload it if new, run the command in it")  # fmt: skip
    submit.add_argument("--gpus", type=int, metavar="N", help="GPUs on each node (default: 1)")
    submit.add_argument("--nodes", type=int, metavar="N",
                        help="nodes for a gang that starts all at once (default: 1)")  # fmt: skip
    submit.add_argument("--sku", dest="gpu_sku", metavar="SKU",
                        help="the GPU model, e.g. H100-80GB (`gpuplatform nodes` lists them)")  # fmt: skip
    submit.add_argument("--name", help="the job's name (default: its script's, else the workdir's)")
    submit.add_argument("--tier", help="run under this tier (default: your tenant's)")
    submit.add_argument("--max-runtime", type=int, dest="max_runtime_seconds", metavar="SECONDS",
                        help="stop the job after this long (default: the template's, else 3600)")  # fmt: skip
    submit.add_argument("--idempotency-key", metavar="KEY",
                        help="the same key again answers with the job it made, not a new one")  # fmt: skip
    submit.add_argument("--env", "-e", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable for the job (repeatable)")  # fmt: skip
    submit.add_argument("--secret", "-s", action="append", default=[], metavar="NAME",
                        help="a tenant secret to set in the job's environment (repeatable)")  # fmt: skip
    submit.add_argument("--image", metavar="REF",
                        help="an OCI image as the job's root, HOST[:PORT]/REPO[:TAG][@sha256:DIGEST]; "
                             "without a command its own Cmd runs")  # fmt: skip
    submit.add_argument("--image-pull-secret", metavar="NAME",
                        help="a tenant secret holding the registry's user:password")  # fmt: skip
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
                        help=f"run after job or array ID (COND: {', '.join(CONDITIONS)}; afterok by "
                             "default; `array:ID` or `job:ID` to say which it is)")  # fmt: skip
    submit.add_argument("--wait", action="store_true", help="then follow it until it ends")
    submit.set_defaults(run=cmd_submit, trailing=[])


def _secrets_commands(secrets: Parser, top: Parser) -> None:
    actions = secrets.add_subparsers(dest="action", required=True, metavar="ACTION",
                                     help="list, set or delete")  # fmt: skip
    listing = actions.add_parser("list", help="names and dates")
    listing.set_defaults(run=cmd_secrets_list)
    setting = actions.add_parser(
        "set", help="create or replace one (the value from stdin or --from-file)"
    )
    setting.add_argument(
        "name", metavar="NAME", help="the variable's name in the job, e.g. HF_TOKEN"
    )
    setting.add_argument("--from-file", metavar="FILE", help="the value is this file's content")
    setting.set_defaults(run=cmd_secrets_set)
    deleting = actions.add_parser("delete", help="delete one")
    deleting.add_argument("name", metavar="NAME", help="the secret's name")
    deleting.set_defaults(run=cmd_secrets_delete)
    for name, each in (("list", listing), ("set", setting), ("delete", deleting)):
        top.commands[f"secrets {name}"] = each


def _client(args) -> Client:
    url, token = load_settings(args.profile)
    token = args.token or token
    if not token:
        raise ConfigError(
            "no API token: use --token, set GPUPLATFORM_TOKEN or write the config file"
        )
    return Client(args.url or url, token)


# --- logs -------------------------------------------------------------------------------------------


def cmd_logs(client: Client, args) -> int:
    text = client.logs(args.job_id, rank=args.rank, attempt=args.attempt)
    sys.stdout.write(text)
    if not text:
        _no_output_yet(client, args.job_id)
    return 0


def _no_output_yet(client: Client, job_id: str) -> None:
    """An empty log: say why when the job has not run yet, rather than print nothing."""
    job = client.get(job_id)
    if job["state"] not in ("queued", "starting"):
        return
    reason = f" ({job['reason']})" if job.get("reason") else ""
    print(f"gpuplatform: job {job['id']} is {job['state']}{reason}: no output yet; "
          f"`gpuplatform wait {job_id}` follows it as it runs", file=sys.stderr)  # fmt: skip


# --- API errors -------------------------------------------------------------------------------------


def _brief(body) -> str:
    if isinstance(body, dict) and set(body) == {"detail"}:
        return str(body["detail"])
    return json.dumps(body) if isinstance(body, dict | list) else str(body)[:500]


def _field_errors(body, prefix: str = "") -> list[str]:
    """`{"env": {"PATH": ["reserved"]}}` -> `["env.PATH: reserved"]`: one line per field."""
    if not isinstance(body, dict) or (not prefix and set(body) <= {"detail"}):
        return []  # not per field: the first line says it all
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
