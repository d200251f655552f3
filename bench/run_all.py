"""`make bench`: run every benchmark module and assemble docs/bench/00-log.md.

Each module writes its own section to docs/bench/<name>.md (with the command that produced
each figure); this script runs them in order and stitches the sections together into the log.
docs/benchmarks.md is the current table, kept by hand: copy a new headline figure there with its
command, date and machine.
"""

import importlib
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SECTIONS = ROOT / "docs" / "bench"
# Module name -> extra argv. Each is run as its own process so one crash does not hide the others.
MODULES: dict[str, list[str]] = {}


def discover() -> list[str]:
    names = []
    for path in sorted((ROOT / "bench").glob("*.py")):
        if path.stem in {"__init__", "run_all"} or path.stem.startswith("_"):
            continue
        module = importlib.import_module(f"bench.{path.stem}")
        if hasattr(module, "main"):
            names.append(path.stem)
    return names


def main() -> int:
    SECTIONS.mkdir(parents=True, exist_ok=True)
    only = sys.argv[1:]
    failed = []
    for name in discover():
        if only and name not in only:
            continue
        print(f"== bench.{name}", flush=True)
        rc = subprocess.call(
            [sys.executable, "-m", f"bench.{name}", *MODULES.get(name, [])], cwd=ROOT
        )
        if rc:
            failed.append(name)
    parts = [
        "# Benchmarks: the full log\n",
        "Produced by `make bench` (`python -m bench.run_all`) on the 2-core, "
        "24 GB development machine. Each section names the command behind its figures.\n",
    ]
    log = SECTIONS / "00-log.md"
    parts += [p.read_text() for p in sorted(SECTIONS.glob("*.md")) if p != log]
    log.write_text("\n".join(parts))
    if failed:
        print("failed:", ", ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
