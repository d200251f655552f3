"""The Python SDK, kept importable as `gpuplatform.client`: it lives in the client package
(`client/gpuplatform_client/api.py`, installed by `pip install ./client`)."""

from gpuplatform import _client_path  # noqa: F401 (the checkout's client/ when not installed)
from gpuplatform_client.api import (
    DEFAULT_URL,
    TERMINAL,
    ApiError,
    Client,
    ConfigError,
    Event,
    config_path,
    load_settings,
    parse_sse,
)

__all__ = ("DEFAULT_URL", "TERMINAL", "ApiError", "Client", "ConfigError", "Event", "config_path",
           "load_settings", "parse_sse")  # fmt: skip
