"""replication/fetcher.py: a partition that a follower starts following while its Fetch
waits upstream is fetched at once, not after that long poll runs out.

The upstream is scripted on a loopback socket: it answers a session's first (full) Fetch
at once and holds every later one for its whole max_wait_ms, as a canopy or Kafka leader
does when nothing new arrives. The fetcher's wait is 30 s, so a fetcher that let the
long poll run out would name the new partition only after the test has failed."""
from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import trio

from protocol.fetch_session import INITIAL_EPOCH
from protocol.framing import FrameReader, encode_response, parse_request_header
from protocol.messages import ApiKey, api
from replication.fetcher import FETCH_VERSION, UpstreamFetcher

SESSION_ID = 7
WAIT_MS = 30_000


def follower_replica(topic: str) -> SimpleNamespace:
    """The duck-typed partition UpstreamFetcher fetches for: one caught-up empty log."""
    return SimpleNamespace(
        topic=SimpleNamespace(name=topic), index=0, leader_epoch=0, upstream=1, needs_truncation=False,
        log=SimpleNamespace(log_end_offset=0, log_start_offset=0), latest_epoch=lambda: 0,
        set_follower_high_watermark=lambda hw: None)


class ScriptedUpstream:
    """Records every Fetch as (connection number, session id, session epoch, topics named)
    and notes which connections the follower closed."""

    def __init__(self) -> None:
        self.fetches: list[tuple[int, int, int, list[str]]] = []
        self.closed: set[int] = set()
        self.seen = trio.Event()   # set on every Fetch received, then replaced
        self._connections = 0

    async def serve(self, stream: trio.SocketStream) -> None:
        self._connections += 1
        number = self._connections
        reader = FrameReader(max_frame_bytes=1 << 20)
        while True:
            frame = reader.next_frame()
            if frame is None:
                data = await stream.receive_some(65536)
                if not data:
                    self.closed.add(number)
                    return
                reader.feed(data)
                continue
            header, at = parse_request_header(frame)
            assert header.api_key == ApiKey.FETCH
            request = api(ApiKey.FETCH).request.decode(frame[at:], header.api_version)
            named = [t["topic"] for t in request["topics"]]
            self.fetches.append((number, request["session_id"], request["session_epoch"], named))
            self.seen.set()
            self.seen = trio.Event()
            if request["session_epoch"] != INITIAL_EPOCH:
                # Nothing new: the whole long poll, unless the follower hangs up meanwhile.
                with trio.move_on_after(request["max_wait_ms"] / 1000):
                    if not await stream.receive_some(65536):
                        self.closed.add(number)
                        return
                    raise AssertionError("a second request while a Fetch was waiting")
            answer = {"throttle_time_ms": 0, "error_code": 0, "session_id": SESSION_ID, "responses": [
                {"topic": t["topic"], "partitions": [
                    {"partition_index": p["partition"], "error_code": 0, "high_watermark": 0,
                     "last_stable_offset": 0, "log_start_offset": 0, "aborted_transactions": [],
                     "preferred_read_replica": -1, "records": b""} for p in t["partitions"]]}
                for t in request["topics"]]}
            await stream.send_all(encode_response(header.correlation_id, ApiKey.FETCH, header.api_version, answer))

    async def wait_for(self, done) -> None:
        while not done():
            await self.seen.wait()


def test_a_partition_followed_during_a_long_poll_is_fetched_at_once():
    upstream = ScriptedUpstream()
    followed = [follower_replica("first")]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, upstream.serve, 0, host="127.0.0.1"))
            port = listeners[0].socket.getsockname()[1]
            fetcher = UpstreamFetcher(2, 1, ("127.0.0.1", port), lambda: list(followed), lambda p: None,
                                      wait_ms=WAIT_MS)
            nursery.start_soon(fetcher.run)
            with trio.fail_after(10):
                # the full Fetch that opens the session, then the long poll in it
                await upstream.wait_for(lambda: len(upstream.fetches) == 2)
                while fetcher._in_flight is None:
                    await trio.sleep(0.01)
            assert upstream.fetches == [(1, 0, INITIAL_EPOCH, ["first"]), (1, SESSION_ID, 1, [])]

            # Metadata changed without a new partition here: the long poll goes on.
            fetcher.partitions_changed()
            assert not fetcher._in_flight[0].cancel_called

            followed.append(follower_replica("second"))
            fetcher.partitions_changed()
            with trio.fail_after(10):
                await upstream.wait_for(lambda: any("second" in f[3] for f in upstream.fetches))
                while 1 not in upstream.closed:
                    await trio.sleep(0.01)
            # A new connection and a new session naming both, closing the old session
            # (KIP-227: its id with epoch 0), so the upstream drops it at once.
            assert upstream.fetches[2] == (2, SESSION_ID, INITIAL_EPOCH, ["first", "second"])
            assert upstream.closed == {1}
            nursery.cancel_scope.cancel()

    trio.run(main)
