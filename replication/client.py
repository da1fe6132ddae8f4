"""A minimal Kafka client on Trio, for broker-to-broker traffic.

A follower is just a client of its upstream (seed 000: a slave "has gone out to another
server over a socket, just like an outside client would"), so replication, forwarding
and the controller's probes all speak the ordinary Kafka protocol through this class.
One request in flight per connection keeps it simple and keeps responses in order.
"""
from __future__ import annotations

import struct
from itertools import count

import trio

from protocol.framing import FrameReader, encode_request
from protocol.messages import api

_corr = count(1)


class PeerError(Exception):
    """The peer could not be reached or answered something unreadable."""


class PeerConnection:
    def __init__(self, host: str, port: int, client_id: str, connect_timeout: float = 2.0):
        self.host = host
        self.port = port
        self.client_id = client_id
        self.connect_timeout = connect_timeout
        self._stream: trio.SocketStream | None = None
        self._reader = FrameReader(max_frame_bytes=1 << 30)
        self._lock = trio.Lock()

    async def _connect(self) -> trio.SocketStream:
        if self._stream is None:
            try:
                with trio.fail_after(self.connect_timeout):
                    self._stream = await trio.open_tcp_stream(self.host, self.port)
            except (OSError, trio.TooSlowError) as e:
                raise PeerError(f"cannot connect to {self.host}:{self.port}: {e}") from None
            self._reader = FrameReader(max_frame_bytes=1 << 30)
        return self._stream

    async def request(self, key: int, version: int, body: dict, timeout: float = 30.0) -> dict:
        async with self._lock:
            try:
                with trio.fail_after(timeout):
                    return await self._request(key, version, body)
            except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
                await self.aclose()
                raise PeerError(f"{self.host}:{self.port}: {type(e).__name__} {e}") from None
            except PeerError:
                await self.aclose()
                raise

    async def _request(self, key: int, version: int, body: dict) -> dict:
        stream = await self._connect()
        corr = next(_corr) & 0x7FFFFFFF
        await stream.send_all(encode_request(key, version, corr, self.client_id, body))
        while True:
            frame = self._reader.next_frame()
            if frame is not None:
                break
            data = await stream.receive_some(1 << 20)
            if not data:
                raise PeerError(f"{self.host}:{self.port} closed the connection")
            self._reader.feed(data)
        (got,) = struct.unpack_from(">i", frame)
        if got != corr:
            raise PeerError(f"correlation id {got} != {corr}")
        a = api(key)
        skip = 4 + (1 if a.response_header_version(version) >= 1 else 0)
        try:
            return a.response.decode(frame[skip:], version, exact=False)
        except Exception as e:  # a peer speaking garbage is an unreachable peer
            raise PeerError(f"undecodable {a.name} response: {e}") from None

    async def aclose(self) -> None:
        if self._stream is not None:
            with trio.CancelScope(shield=True):
                try:
                    await self._stream.aclose()
                except (trio.BrokenResourceError, OSError):
                    pass
            self._stream = None
