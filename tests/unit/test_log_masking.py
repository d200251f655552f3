"""Secrets masked in a job's log as it streams (workers/masking.py)."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from workers.masking import MIN_MASKED, Masker, mask


def streamed(text: bytes, values, cuts) -> bytes:
    masker = Masker(values)
    out, start = [], 0
    for cut in sorted(set(cuts)) + [len(text)]:
        out.append(masker.feed(text[start:cut]))
        start = cut
    out.append(masker.flush())
    return b"".join(out)


def test_every_occurrence_is_masked():
    assert mask(b"token=hunter22 and again hunter22.", ["hunter22"]) == b"token=*** and again ***."


def test_a_value_split_across_two_reads_is_still_masked():
    text = b"the key is sk-abcdef123456, done\n"
    for cut in range(len(text) + 1):
        assert streamed(text, ["sk-abcdef123456"], [cut]) == b"the key is ***, done\n"


def test_a_value_split_across_many_reads_one_byte_each():
    text = b"x" * 10 + b"SECRET-VALUE" + b"y" * 10
    assert streamed(text, ["SECRET-VALUE"], range(len(text))) == b"x" * 10 + b"***" + b"y" * 10


def test_the_longest_of_overlapping_values_wins():
    assert mask(b"abcdefgh abcd", ["abcd", "abcdefgh"]) == b"*** ***"


def test_short_values_are_not_masked():
    assert MIN_MASKED == 4
    assert mask(b"abc 1234", ["abc", "1234"]) == b"abc ***"
    assert mask(b"nothing", ["", "ab"]) == b"nothing"


def test_nothing_is_held_back_without_secrets():
    masker = Masker([])
    assert masker.feed(b"partial line") == b"partial line" and masker.flush() == b""


def test_only_a_value_long_prefix_is_held_back():
    masker = Masker(["0123456789"])
    assert masker.feed(b"hello world, 01234") == b"hello wor"  # 9 bytes could start the value
    assert masker.feed(b"56789!") + masker.flush() == b"ld, ***!"


def test_multibyte_values():
    assert mask("naïve-Schlüssel ok".encode(), ["naïve-Schlüssel"]) == b"*** ok"


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.text(alphabet="ab-", min_size=4, max_size=8), min_size=1, max_size=3),
    noise=st.text(alphabet="ab- \n", max_size=60),
    seed=st.integers(0, 1000),
)
def test_streaming_matches_masking_all_at_once(values, noise, seed):
    """However the stream is cut, the result is the one of masking the whole text."""
    text = (noise + values[0] + noise).encode()
    rng = random.Random(seed)
    cuts = [rng.randrange(len(text) + 1) for _ in range(rng.randrange(6))]
    whole = mask(text, values)
    assert streamed(text, values, cuts) == whole
    assert values[0].encode() not in whole or any(
        len(v) > len(values[0]) and values[0] in v for v in values
    )
