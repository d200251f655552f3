"""Mask a job's secret values in its log as it streams (`***` for every occurrence), before a
byte of it is stored on the node or sent to the platform. Pure Python, no Django.

The log arrives in chunks read from a pipe, so a value may be split across two of them: the
masker holds back the last len(longest value) - 1 bytes of each chunk until the next one (or
the end) shows whether they start a value. Values shorter than MIN_MASKED bytes are not masked:
masking every `a` or `42` in a log would destroy it and hide nothing a guess would not find
(the agent writes one line at the head of the log naming such a secret, never its value).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = b"***"
MIN_MASKED = 4


def maskable(values: Iterable[str]) -> list[bytes]:
    """The values a masker masks: UTF-8, at least MIN_MASKED bytes, each once."""
    found = {value.encode() for value in values if len(value.encode()) >= MIN_MASKED}
    return sorted(found, key=lambda v: (-len(v), v))  # the longest first where two overlap


class Masker:
    def __init__(self, values: Iterable[str]):
        self.values = maskable(values)
        self.hold = max((len(v) for v in self.values), default=1) - 1
        self.pattern = (
            re.compile(b"|".join(re.escape(v) for v in self.values)) if self.values else None
        )
        self.pending = b""

    def feed(self, chunk: bytes) -> bytes:
        """What of `chunk` (after what was held back) can be written now, masked."""
        if self.pattern is None:
            return chunk
        data = self.pending + chunk
        # A value starting at or after `limit` might run past the end of what we have: wait.
        limit = max(0, len(data) - self.hold)
        out, position = [], 0
        for match in self.pattern.finditer(data):
            if match.start() >= limit:
                break
            out += [data[position : match.start()], MASK]
            position = match.end()
        cut = max(position, limit)
        out.append(data[position:cut])
        self.pending = data[cut:]
        return b"".join(out)

    def flush(self) -> bytes:
        """The rest, at the end of the stream."""
        if self.pattern is None:
            return b""
        data, self.pending = self.pending, b""
        return self.pattern.sub(MASK, data)


def mask(text: bytes, values: Iterable[str]) -> bytes:
    """All of `text` at once."""
    masker = Masker(values)
    return masker.feed(text) + masker.flush()
