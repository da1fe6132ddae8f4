"""KIP-227 fetch-session metadata as the Fetch request carries it (v7+): the ids and epochs
both ends must agree on. The session state machines live where they are used: the
broker's cache in broker/fetch_sessions.py, a follower's side in replication/fetch_session.py."""
from __future__ import annotations

INVALID_SESSION_ID = 0   # "no session": in a request, sessionless; in an answer, none was made
INITIAL_EPOCH = 0        # a full Fetch that asks for a new session
FINAL_EPOCH = -1         # a full Fetch without a session (closing the named one)
INT32_MAX = 2**31 - 1    # session ids are positive int32s


def next_epoch(epoch: int) -> int:
    """The epoch the next request of a session carries: wraps to 1, never to 0 or -1."""
    return 1 if epoch >= INT32_MAX else epoch + 1
