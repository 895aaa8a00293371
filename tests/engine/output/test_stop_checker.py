"""StopChecker: token stop conditions, and stop strings that must never leak however text is chunked."""

from __future__ import annotations

import itertools

from engine.messages import SamplingParams
from engine.output.stop_checker import StopChecker

import pytest

EOS = 2


def _checker(max_tokens: int = 100, **params) -> StopChecker:
    return StopChecker(SamplingParams(**params), {EOS}, max_tokens)


def _feed(checker: StopChecker, chunks: list[str]) -> tuple[str, str | None]:
    """Streams chunks as one token each; returns everything emitted and the matched stop string."""
    emitted = []
    for n, chunk in enumerate(chunks, start=1):
        assert checker.check_token(100 + n, n) is None
        text, matched = checker.process_text(chunk)
        emitted.append(text)
        if matched is not None:
            assert checker.process_text("and after") == ("", None)
            assert checker.flush() == ""
            return "".join(emitted), matched
    return "".join(emitted) + checker.flush(), None


def _splits(text: str, max_pieces: int = 3):
    """Every way to cut `text` into up to `max_pieces` chunks, plus char by char."""
    yield [text]
    for num_cuts in range(1, max_pieces):
        for cuts in itertools.combinations(range(1, len(text)), num_cuts):
            bounds = (0, *cuts, len(text))
            yield [text[a:b] for a, b in itertools.pairwise(bounds)]
    yield list(text)


TEXT = "Say STOP now, then more"


@pytest.mark.parametrize("chunks", list(_splits(TEXT)))
def test_stop_string_split_anywhere_never_leaks(chunks):
    assert _feed(_checker(stop=["STOP"]), chunks) == ("Say ", "STOP")
    assert _feed(_checker(stop=["STOP"], include_stop_str_in_output=True), chunks) == ("Say STOP", "STOP")


def test_emitted_text_never_holds_the_start_of_a_stop_string():
    checker = _checker(stop=["STOP"])
    assert checker.process_text("Say S") == ("Say ", None)
    assert checker.process_text("T") == ("", None)
    assert checker.process_text("O") == ("", None)
    assert checker.process_text("P!") == ("", "STOP")


def test_a_false_start_is_released_once_it_cannot_match():
    checker = _checker(stop=["STOP"])
    assert checker.process_text("ST") == ("", None)
    assert checker.process_text("AR") == ("STAR", None)
    assert checker.process_text(" ST") == (" ", None)
    assert checker.flush() == "ST"  # a finish without a match releases the held tail


def test_text_without_stop_strings_passes_straight_through():
    assert _checker().process_text("S") == ("S", None)


@pytest.mark.parametrize("chunks", list(_splits("Hello world")))
def test_the_stop_string_that_ends_first_wins_for_every_chunking(chunks):
    assert _feed(_checker(stop=["world", "lo w"]), chunks) == ("Hel", "lo w")
    # same end: the longer (earlier-starting) one
    assert _feed(_checker(stop=["rld", "world"]), chunks) == ("Hello ", "world")


@pytest.mark.parametrize("chunks", list(_splits("xaaab")))
def test_overlapping_partial_matches(chunks):
    assert _feed(_checker(stop=["aab"]), chunks) == ("xa", "aab")


def test_max_tokens_reports_length():
    checker = _checker(max_tokens=3)
    assert checker.check_token(7, 1) is None
    assert checker.check_token(7, 2) is None
    assert checker.check_token(7, 3) == ("length", None)


def test_eos_and_stop_token_ids_stop_with_their_reasons():
    checker = _checker(stop_token_ids=[9])
    assert checker.check_token(5, 1) is None
    assert checker.check_token(EOS, 2) == ("stop", None)
    assert checker.check_token(9, 3) == ("stop", 9)
    # a stop at the last allowed token is still a stop, as vLLM
    assert _checker(max_tokens=2).check_token(EOS, 2) == ("stop", None)


def test_ignore_eos_runs_on_to_max_tokens():
    checker = _checker(max_tokens=4, ignore_eos=True, stop_token_ids=[9])
    assert checker.check_token(EOS, 1) is None
    assert checker.check_token(9, 2) == ("stop", 9)  # ignore_eos leaves stop_token_ids alone
    assert checker.check_token(EOS, 4) == ("length", None)


def test_min_tokens_defers_eos_and_stop_token_ids():
    checker = _checker(min_tokens=3, stop_token_ids=[9])
    assert checker.check_token(EOS, 1) is None
    assert checker.check_token(9, 2) is None
    assert checker.check_token(EOS, 3) == ("stop", None)
    # max_tokens still ends a request cut short by the context length, even below min_tokens
    assert _checker(max_tokens=2, min_tokens=5).check_token(7, 2) == ("length", None)


def test_min_tokens_defers_stop_strings_that_end_in_its_text():
    # vLLM: a stop string counts only if it ends in text from tokens after the first min_tokens.
    checker = _checker(min_tokens=2, stop=["e", "xy"])
    texts, emitted = ["He", "llo", " th", "ere"], []
    for n, text in enumerate(texts, start=1):
        assert checker.check_token(100, n) is None
        piece, matched = checker.process_text(text)
        emitted.append(piece)
        if matched is not None:
            break
    assert ("".join(emitted), matched, n) == ("Hello th", "e", 4)
    straddle = _checker(min_tokens=1, stop=["xy"])
    straddle.check_token(100, 1)
    assert straddle.process_text("ax") == ("a", None)  # "x" may start a stop string: held
    straddle.check_token(100, 2)
    assert straddle.process_text("yz") == ("", "xy")  # starts in min_tokens text, ends after
