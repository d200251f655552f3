"""Secrets masked in a job's log as it streams (workers/masking.py)."""

import base64
import random
from urllib.parse import quote, quote_plus

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


def test_only_a_prefix_as_long_as_the_longest_form_is_held_back():
    masker = Masker(["0123456789"])
    assert masker.hold == 19  # the longest form is the hex one, 20 bytes: 19 could start it
    assert masker.feed(b"x" * 30 + b"01234") == b"x" * 16
    assert masker.feed(b"56789!") + masker.flush() == b"x" * 14 + b"***!"


def test_multibyte_values():
    assert mask("naïve-Schlüssel ok".encode(), ["naïve-Schlüssel"]) == b"*** ok"


SECRET = "pa ss/wörd+x?9"


def test_the_value_is_masked_in_base64_url_safe_base64_percent_and_hex():
    raw = SECRET.encode()
    printed = [
        base64.b64encode(raw),
        base64.urlsafe_b64encode(raw).rstrip(b"="),
        base64.urlsafe_b64encode(raw),
        quote(SECRET, safe="").encode(),
        quote(SECRET, safe="").lower().encode(),
        quote(SECRET).encode(),
        quote_plus(SECRET).encode(),
        raw.hex().encode(),
        raw.hex().upper().encode(),
    ]
    for form in printed:
        masked = mask(b"token: " + form + b"\n", [SECRET])
        assert masked in (b"token: ***\n", b"token: ***=\n", b"token: ***==\n"), form


def test_a_value_inside_a_longer_base64_string_is_masked_at_each_alignment():
    """Only the characters at the value's two edges mix in its neighbours' bits: the rest is
    masked wherever it starts in a 3-byte group, so none of the value's own bits show."""
    raw = b"sk-abcdef123456"
    for before in range(6):
        for after in range(4):
            encoded = base64.b64encode(b"<" * before + raw + b">" * after)
            left, right = mask(encoded, [raw.decode()]).split(b"***")
            assert encoded.startswith(left) and encoded.endswith(right)
            assert len(left) <= -(-8 * before // 6), (before, after)
            assert len(encoded) - len(right) >= 8 * (before + len(raw)) // 6, (before, after)


def test_an_encoded_value_split_across_reads_is_still_masked():
    text = b"auth=" + base64.b64encode(b"Bearer sk-abcdef123456") + b" done\n"
    for cut in range(len(text) + 1):
        assert streamed(text, ["sk-abcdef123456"], [cut, cut + 3]) == streamed(
            text, ["sk-abcdef123456"], []
        )
    assert b"***" in mask(text, ["sk-abcdef123456"])


def test_a_deliberate_leak_is_not_masked():
    """Masking guards against accidents; a job set on leaking a value can (docs/secrets.md)."""
    assert mask(SECRET[::-1].encode(), [SECRET]) == SECRET[::-1].encode()
    assert mask(" ".join(SECRET).encode(), [SECRET]) == " ".join(SECRET).encode()


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
