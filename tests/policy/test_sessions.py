"""Session affinity through `Router.route`: a session's turns stay on its
last worker while the candidates tie, spread without a session, and a
better-cached or less loaded worker still wins."""

import pytest

from kvrouter._core import PrefixIndex, Stored, hash_tokens
from kvrouter.policy import PolicyConfig, Router

BS = 16
AFFINITY = "session affinity"


def router(n: int = 4) -> Router:
    r = Router(PrefixIndex(BS), PolicyConfig())
    for w in range(n):
        r.upsert_worker(w, "both", 10_000)
    return r


def turn(n: int, blocks: int = 4) -> list[int]:
    """A prompt that no other turn shares a block with."""
    return [n * 1_000_000 + i for i in range(blocks * BS)]


def finished_turn(r: Router, request_id: str, tokens: list[int], session: str = ""):
    d = r.route(request_id, tokens, session=session)
    assert r.finished(request_id)
    return d


def test_first_turns_stay_on_the_sessions_worker_and_spread_without_one():
    r = router()
    plain = {finished_turn(r, f"p{n}", turn(n)).decode_worker for n in range(8)}
    assert len(plain) > 1, plain

    first = finished_turn(r, "s0", turn(100), session="chat")
    later = [finished_turn(r, f"s{n}", turn(100 + n), session="chat") for n in range(1, 8)]
    assert {d.decode_worker for d in later} == {first.decode_worker}
    assert all(AFFINITY in d.explanation.reason for d in later)
    assert r.stats().by_affinity == 7


def test_two_sessions_keep_their_own_workers():
    r = router()
    homes = {s: finished_turn(r, f"{s}0", turn(ord(s)), session=s).decode_worker for s in "ab"}
    for n in range(1, 5):
        for s in "ab":
            d = finished_turn(r, f"{s}{n}", turn(ord(s) * 10 + n), session=s)
            assert d.decode_worker == homes[s]


def test_requests_in_flight_spread_by_load_even_within_a_session():
    r = router(2)
    first = r.route("a", turn(1, 64), session="chat")
    second = r.route("b", turn(2, 64), session="chat")
    assert second.decode_worker != first.decode_worker
    assert AFFINITY not in second.explanation.reason


def test_a_worker_with_more_of_the_prompt_cached_wins_despite_the_session():
    r = router()
    home = finished_turn(r, "a", turn(1), session="chat").decode_worker
    other = (home + 1) % 4
    cached = turn(2, 32)
    r.index.apply(other, 0, [Stored(hash_tokens(cached, BS), cached)])
    d = finished_turn(r, "b", cached, session="chat")
    assert d.decode_worker == other
    assert AFFINITY not in d.explanation.reason
    # The session's worker is now the one its last turn went to.
    assert finished_turn(r, "c", turn(3), session="chat").decode_worker == other


@pytest.mark.parametrize("session", ["s" * 257, "tab\tinside"])
def test_a_bad_session_id_is_refused(session):
    r = router()
    with pytest.raises(ValueError, match="session_id"):
        r.route("a", turn(1), session=session)
    assert len(r) == 0
