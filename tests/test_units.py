import pytest

from lcmoe.errors import LcmoeError
from lcmoe.units import format_tokens, parse_token_count


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("4096", 4096),
        ("4k", 4096),
        ("4K", 4096),
        ("128K", 131072),
        ("131072", 131072),
        ("1e6", 1_000_000),
        ("1M", 1048576),
        (" 32k ", 32768),
        (8192, 8192),
    ],
)
def test_parse_token_count_accepts_the_usual_spellings(text: str | int, tokens: int) -> None:
    assert parse_token_count(text) == tokens


@pytest.mark.parametrize("text", ["-1", "0", "abc", "1.5", "4kk", "", "nan", "inf", "1e400"])
def test_parse_token_count_rejects_with_one_sentence(text: str) -> None:
    with pytest.raises(LcmoeError) as info:
        parse_token_count(text)
    assert "seq_len" in str(info.value)
    assert "\n" not in str(info.value)


def test_format_tokens_round_trips_powers_of_two() -> None:
    assert format_tokens(131072) == "128K"
    assert format_tokens(1048576) == "1M"
    assert format_tokens(1000) == "1000"
