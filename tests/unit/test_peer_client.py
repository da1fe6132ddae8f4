"""replication/client.PeerConnection against a scripted peer on a loopback socket: one
request in flight per connection, answers matched to their requests, and a caller that
is already cancelled sends nothing (the lock is taken without a checkpoint, so the
client checks for that itself)."""
from __future__ import annotations

from contextlib import asynccontextmanager

import trio

from protocol.framing import FrameReader, encode_response, parse_request_header
from protocol.messages import ApiKey
from replication.client import PeerConnection

ANSWER = {"error_code": 0, "api_keys": [{"api_key": 1, "min_version": 4, "max_version": 12}],
          "throttle_time_ms": 0}


async def scripted_peer(seen: list, delay: float = 0.0, task_status=trio.TASK_STATUS_IGNORED):
    """Answers every ApiVersions v3 request in order, after ``delay``; records what it got
    as (correlation id, time received, time answered) per request, and bytes received."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])

    async def serve(stream):
        reader = FrameReader(max_frame_bytes=1 << 20)
        while True:
            frame = reader.next_frame()
            if frame is None:
                data = await stream.receive_some(65536)
                if not data:
                    return
                seen.append(("bytes", len(data)))
                reader.feed(data)
                continue
            header, _ = parse_request_header(frame)
            received = trio.current_time()
            await trio.sleep(delay)
            seen.append((header.correlation_id, received, trio.current_time()))
            await stream.send_all(encode_response(header.correlation_id, ApiKey.API_VERSIONS, 3, ANSWER))

    await trio.serve_listeners(serve, listeners)


BODY = {"client_software_name": "t", "client_software_version": "1"}


@asynccontextmanager
async def connected(seen: list, delay: float = 0.0):
    """A PeerConnection to a scripted peer, both gone at the end of the block."""
    async with trio.open_nursery() as n:
        port = await n.start(scripted_peer, seen, delay)
        conn = PeerConnection("127.0.0.1", port, "t")
        yield conn
        await conn.aclose()
        n.cancel_scope.cancel()


def requests_answered(seen: list) -> list:
    return [s for s in seen if s[0] != "bytes"]


def test_answers_come_back_to_their_requests_on_one_connection():
    async def main():
        seen = []
        async with connected(seen) as conn:
            for _ in range(3):
                r = await conn.request(ApiKey.API_VERSIONS, 3, BODY)
                assert r["api_keys"][0]["max_version"] == 12
        assert len(requests_answered(seen)) == 3
    trio.run(main)


def test_concurrent_callers_take_turns():
    """Two tasks share a connection: the second request goes out only once the first is
    answered (the peer never holds two at once), and each caller gets an answer."""
    async def main():
        seen = []
        answers = []
        async with connected(seen, 0.05) as conn:
            async def call():
                answers.append(await conn.request(ApiKey.API_VERSIONS, 3, BODY))
            async with trio.open_nursery() as callers:
                callers.start_soon(call)
                callers.start_soon(call)
        done = requests_answered(seen)
        assert len(done) == 2 and len(answers) == 2
        assert done[1][1] >= done[0][2]   # received after the first was answered
    trio.run(main)


def test_a_cancelled_caller_sends_nothing():
    async def main():
        seen = []
        async with connected(seen) as conn:
            await conn.request(ApiKey.API_VERSIONS, 3, BODY)   # connected
            before = list(seen)
            with trio.CancelScope() as scope:
                scope.cancel()
                await conn.request(ApiKey.API_VERSIONS, 3, BODY)
            assert scope.cancelled_caught
            await trio.sleep(0.1)
            assert seen == before
            # The connection is still good: the next request is answered.
            r = await conn.request(ApiKey.API_VERSIONS, 3, BODY)
            assert r["error_code"] == 0
    trio.run(main)
