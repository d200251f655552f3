"""gpuplatform's client: the `gpuplatform` command line and the Python SDK for its public API.

from gpuplatform_client import Client, pack
"""

from . import pack
from .api import ApiError, Client, ConfigError, Event, load_settings, parse_sse

__all__ = ("ApiError", "Client", "ConfigError", "Event", "load_settings", "pack", "parse_sse")
__version__ = "0.2.0"
