"""replication/fetch_session.py: the follower's side of KIP-227, without a network."""
from __future__ import annotations

from protocol.errors import ErrorCode
from replication.fetch_session import FetchSessionHandler


def fields(idx: int, offset: int) -> dict:
    return {"partition": idx, "fetch_offset": offset, "current_leader_epoch": 3}


def as_is(key, state):
    return state


def test_full_then_incremental_names_only_changes_and_forgets_the_rest():
    h = FetchSessionHandler()
    wanted = {("t", 0): fields(0, 10), ("t", 1): fields(1, 20), ("u", 0): fields(0, 5)}
    req = h.build(wanted, as_is)
    assert (req["session_id"], req["session_epoch"]) == (0, 0)
    assert sum(len(t["partitions"]) for t in req["topics"]) == 3
    h.on_response(0, 77)
    req = h.build(wanted, as_is)
    assert (req["session_id"], req["session_epoch"], req["topics"], req["forgotten_topics_data"]) == \
        (77, 1, [], [])
    h.on_response(0, 77)
    req = h.build({("t", 0): fields(0, 11), ("t", 1): fields(1, 20)}, as_is)
    assert req["session_epoch"] == 2
    assert req["topics"] == [{"topic": "t", "partitions": [fields(0, 11)]}]
    assert req["forgotten_topics_data"] == [{"topic": "u", "partitions": [0]}]
    h.on_response(0, 77)
    assert h.sent == {("t", 0): fields(0, 11), ("t", 1): fields(1, 20)} and h.epoch == 3


def test_any_error_or_lost_answer_starts_over_with_a_full_fetch():
    for fail in (lambda h: h.on_response(ErrorCode.FETCH_SESSION_ID_NOT_FOUND, 0),
                 lambda h: h.on_response(ErrorCode.INVALID_FETCH_SESSION_EPOCH, 0),
                 lambda h: h.on_response(0, 99),      # an answer from some other session
                 lambda h: h.reset()):                # the connection failed
        h = FetchSessionHandler()
        wanted = {("t", 0): fields(0, 1)}
        h.build(wanted, as_is)
        h.on_response(0, 5)
        h.build(wanted, as_is)
        fail(h)
        req = h.build(wanted, as_is)
        # A full Fetch that also closes the abandoned session (KIP-227: id with epoch 0).
        assert (req["session_id"], req["session_epoch"]) == (5, 0) and req["topics"]
        h.on_response(0, 6)
        assert (h.build(wanted, as_is)["session_id"], h.epoch) == (6, 1)


def test_no_room_for_a_session_keeps_sending_full_fetches():
    h = FetchSessionHandler()
    wanted = {("t", 0): fields(0, 1)}
    h.build(wanted, as_is)
    h.on_response(0, 0)
    req = h.build(wanted, as_is)
    assert (req["session_id"], req["session_epoch"]) == (0, 0) and req["topics"]
