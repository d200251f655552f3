"""The node agent running in this process, if any (set by `python -m workers.agent`)."""

AGENT = None
