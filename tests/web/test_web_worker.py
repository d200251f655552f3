"""The web worker's server (gpuplatform/web_worker.py) runs on uvloop and httptools or not at all:
uvicorn's "auto" fell back to asyncio's loop and the pure-Python h11 parser without a word when
either was missing, and the server's CPU a request grew by a third to three quarters."""

import subprocess
import sys

# A fresh interpreter where the package cannot be imported (None in sys.modules), building the
# worker's uvicorn Config as the worker does; prints what uvicorn picked.
PROBE = """
import sys
sys.modules[{missing!r}] = None
from uvicorn.config import Config
from gpuplatform.web_worker import Worker
config = Config(app=None, **Worker.CONFIG_KWARGS)
try:
    if {missing!r} == "uvloop":
        print(config.get_loop_factory()().__class__.__module__)
    else:
        config.load()
        print(config.http_protocol_class.__name__)
except ImportError:
    print("refused")
"""


def probe(missing: str) -> str:
    done = subprocess.run([sys.executable, "-c", PROBE.format(missing=missing)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_the_worker_names_uvloop_and_httptools():
    from uvicorn.config import Config

    from gpuplatform.web_worker import Worker

    config = Config(app=lambda *a: None, **Worker.CONFIG_KWARGS)
    config.load()
    assert config.http_protocol_class.__name__ == "HttpToolsProtocol"
    assert config.get_loop_factory()().__class__.__module__.startswith("uvloop")


def test_without_httptools_the_worker_refuses_rather_than_parse_in_python():
    assert probe("httptools") == "refused"


def test_without_uvloop_the_worker_refuses_rather_than_run_asyncio_s_loop():
    assert probe("uvloop") == "refused"
