"""The follower's half of a KIP-227 fetch session (the Java client's FetchSessionHandler).

A follower of 1 000 partitions would otherwise name all of them in every Fetch and get all
of them back. In a session it names only the partitions whose fetch state changed since
the last request (offset, epochs, log start), forgets those it no longer fetches here,
and the upstream answers only partitions with news (broker/fetch_sessions.py).

Sans-IO: ``build`` turns the wanted partitions into request fields, ``on_response`` and
``reset`` follow the answer. Any failure (an error answer, a lost connection, an upstream
that restarted and forgot the session) resets to a full Fetch that opens a new session.
"""
from __future__ import annotations

from typing import Callable

from protocol.fetch_session import INITIAL_EPOCH, INVALID_SESSION_ID, next_epoch


class FetchSessionHandler:
    def __init__(self):
        self.session_id = INVALID_SESSION_ID
        self.epoch = INITIAL_EPOCH
        # (topic, partition) -> the fetch state last sent for it in this session
        self.sent: dict[tuple[str, int], object] = {}
        self._pending: dict[tuple[str, int], object] | None = None
        # A session given up on is named in the next full Fetch (epoch 0 with its id), so
        # the upstream drops it at once instead of keeping it until eviction.
        self._close_id = INVALID_SESSION_ID

    def build(self, wanted: dict[tuple[str, int], object], fields: Callable[[tuple[str, int], object], dict]) -> dict:
        """Request fields (session_id, session_epoch, topics, forgotten_topics_data) for
        fetching ``wanted``: (topic, partition) -> that partition's fetch state (any value
        that compares equal when nothing changed); ``fields(key, state)`` makes its
        request fields."""
        self._pending = wanted
        if self.session_id == INVALID_SESSION_ID:
            return {"session_id": self._close_id, "session_epoch": INITIAL_EPOCH,
                    "topics": _by_topic((k, fields(k, v)) for k, v in wanted.items()),
                    "forgotten_topics_data": []}
        sent = self.sent
        changed = [(k, fields(k, v)) for k, v in wanted.items() if sent.get(k) != v]
        forgotten: dict[str, list[int]] = {}
        for topic, idx in self.sent.keys() - wanted.keys():
            forgotten.setdefault(topic, []).append(idx)
        return {"session_id": self.session_id, "session_epoch": self.epoch,
                "topics": _by_topic(changed),
                "forgotten_topics_data": [{"topic": t, "partitions": sorted(ps)} for t, ps in forgotten.items()]}

    def on_response(self, error_code: int, session_id: int) -> None:
        if error_code or self._pending is None:
            self.reset()
            return
        if self.session_id == INVALID_SESSION_ID:
            # The answer to a full Fetch: a new session (or none, id 0: stay with full fetches).
            self.session_id = session_id
            self._close_id = INVALID_SESSION_ID
        elif session_id != self.session_id:
            self.reset()
            return
        self.sent = self._pending if session_id != INVALID_SESSION_ID else {}
        self._pending = None
        if self.session_id != INVALID_SESSION_ID:
            self.epoch = next_epoch(self.epoch)

    def reset(self) -> None:
        if self.session_id != INVALID_SESSION_ID:
            self._close_id = self.session_id
        self.session_id = INVALID_SESSION_ID
        self.epoch = INITIAL_EPOCH
        self.sent = {}
        self._pending = None


def _by_topic(items) -> list[dict]:
    topics: dict[str, list[dict]] = {}
    for (topic, _), fields in items:
        topics.setdefault(topic, []).append(fields)
    return [{"topic": t, "partitions": ps} for t, ps in topics.items()]
