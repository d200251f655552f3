"""Mask a job's secret values in its log as it streams (`***` for every occurrence), before a
byte of it is stored on the node or sent to the platform. Pure Python, no Django.

The log arrives in chunks read from a pipe, so a value may be split across two of them: the
masker holds back the last len(longest value) - 1 bytes of each chunk until the next one (or
the end) shows whether they start a value. Values shorter than MIN_MASKED bytes are not masked:
masking every `a` or `42` in a log would destroy it and hide nothing a guess would not find
(the agent writes one line at the head of the log naming such a secret, never its value).

Each value is masked in the forms a job prints by accident too (`encodings`): base64 (standard
and URL-safe, whole or inside a longer base64 string), percent-encoded, hex. A job that means to
leak a value can always do it another way (reversed, split, XORed): masking guards against
accidents, it is not a boundary (docs/secrets.md, "Masked in logs").
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from urllib.parse import quote, quote_plus

MASK = b"***"
MIN_MASKED = 4


def maskable(values: Iterable[str]) -> list[bytes]:
    """What a masker masks: each value of at least MIN_MASKED bytes of UTF-8 and its encodings
    (those of MIN_MASKED bytes or more), each once."""
    found = set()
    for value in values:
        raw = value.encode()
        if len(raw) >= MIN_MASKED:
            found |= {form for form in encodings(raw) if len(form) >= MIN_MASKED}
    return sorted(found, key=lambda v: (-len(v), v))  # the longest first where two overlap


def encodings(value: bytes) -> set[bytes]:
    """`value` and the encodings of it a job is likely to print by accident."""
    standard = {base64.b64encode(value), *base64_cores(value)}
    url_safe = {form.translate(_URL_SAFE).rstrip(b"=") for form in standard}
    percent = {quote(value, safe=""), quote(value), quote_plus(value, safe="")}
    percent |= {_lower_escapes(form) for form in percent}
    hexed = value.hex().encode()
    return {value, *standard, *url_safe, *(form.encode() for form in percent), hexed, hexed.upper()}


def base64_cores(value: bytes) -> list[bytes]:
    """For each of the 3 places `value` can start in a 3-byte base64 group, the characters of
    a longer base64 string that only `value`'s bits decide: those 6-bit windows lying wholly
    inside it (the characters at its two edges mix in the bytes around it, so they vary)."""
    cores = []
    for shift in range(3):
        # The zero bytes only fill the groups at both ends; no kept character reads them.
        encoded = base64.b64encode(bytes(shift) + value + bytes(2))
        first = -(-8 * shift // 6)  # the first window starting at or after the value's first bit
        end = 8 * (shift + len(value)) // 6  # past the last window ending by its last bit
        cores.append(encoded[first:end])
    return cores


_URL_SAFE = bytes.maketrans(b"+/", b"-_")


def _lower_escapes(percent_encoded: str) -> str:
    return re.sub("%[0-9A-F]{2}", lambda escape: escape.group().lower(), percent_encoded)


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
