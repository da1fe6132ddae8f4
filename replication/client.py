"""A minimal Kafka client on Trio, for broker-to-broker traffic.

A follower is just a client of its upstream (seed 000: a slave "has gone out to another
server over a socket, just like an outside client would"), so replication, forwarding
and the controller's probes all speak the ordinary Kafka protocol through this class.
One request in flight per connection keeps it simple and keeps responses in order.

The connection speaks the security protocol of the listener it dials (client_security.py):
TLS with trio.SSLStream, then for SASL a SaslHandshake v1 and SaslAuthenticate round trips
before the first request, as every Kafka client does.
"""
from __future__ import annotations

import os
import socket
from itertools import count

import trio

from protocol.framing import FrameReader, encode_request, parse_response_header
from protocol.messages import ApiKey, api

from .client_security import PLAINTEXT, ClientSecurity, SaslClientError

_corr = count(1)


class PeerError(Exception):
    """The peer could not be reached or answered something unreadable."""


class PeerConnection:
    def __init__(self, host: str, port: int, client_id: str, connect_timeout: float = 2.0,
                 security: ClientSecurity = PLAINTEXT):
        self.host = host
        self.port = port
        self.client_id = client_id
        self.connect_timeout = connect_timeout
        self.security = security
        self._stream: trio.abc.Stream | None = None
        self._reader = FrameReader(max_frame_bytes=1 << 30)
        self._lock = trio.Lock()

    async def _connect(self) -> trio.abc.Stream:
        if self._stream is None:
            sec = self.security
            try:
                with trio.fail_after(self.connect_timeout):
                    stream = await trio.open_tcp_stream(self.host, self.port)
            except (OSError, trio.TooSlowError) as e:
                raise PeerError(f"cannot connect to {self.host}:{self.port}: {e}") from None
            self._reader = FrameReader(max_frame_bytes=1 << 30)
            try:
                if sec.uses_tls:
                    stream = trio.SSLStream(stream, sec.ssl_context, server_hostname=self.host)
                    try:
                        with trio.fail_after(max(self.connect_timeout, 10.0)):
                            await stream.do_handshake()
                    except (trio.BrokenResourceError, trio.TooSlowError, OSError) as e:
                        cause = e.__cause__ or e
                        raise PeerError(f"TLS handshake with {self.host}:{self.port} failed: "
                                        f"{getattr(cause, 'reason', None) or cause}") from None
                if sec.uses_sasl:
                    with trio.fail_after(max(self.connect_timeout, 10.0)):
                        await self._authenticate(stream)
            except BaseException:
                with trio.CancelScope(shield=True):
                    try:
                        await stream.aclose()
                    except (trio.BrokenResourceError, OSError):
                        pass
                raise
            self._stream = stream
        return self._stream

    async def _authenticate(self, stream) -> None:
        """SaslHandshake v1, then SaslAuthenticate v1 until the mechanism completes."""
        sec = self.security
        hs = await self._exchange(stream, ApiKey.SASL_HANDSHAKE, 1, {"mechanism": sec.sasl_mechanism})
        if hs["error_code"]:
            raise PeerError(f"{self.host}:{self.port} refused SASL mechanism {sec.sasl_mechanism} "
                            f"(error {hs['error_code']}; enabled: {', '.join(hs['mechanisms'])})")
        client = sec.sasl_client()
        token = client.first()
        while token is not None:
            r = await self._exchange(stream, ApiKey.SASL_AUTHENTICATE, 1, {"auth_bytes": token})
            if r["error_code"]:
                raise PeerError(f"{self.host}:{self.port}: SASL authentication as {sec.sasl_username!r} failed: "
                                f"{r['error_message'] or r['error_code']}")
            try:
                token = client.step(bytes(r["auth_bytes"]))
            except SaslClientError as e:
                raise PeerError(f"{self.host}:{self.port}: {e}") from None

    async def request(self, key: int, version: int, body: dict, timeout: float = 30.0) -> dict:
        # The lock is almost always free (a follower's fetcher owns its connection): take it
        # without Lock.acquire's trip through the scheduler, a third of a Fetch round's
        # passes through Trio's run loop (each an epoll_wait and a reschedule). The wait for
        # the response remains the checkpoint that lets a cancellation in; one already
        # delivered stops the request here, before it is sent, as acquire() would.
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self._lock.acquire_nowait()
        except trio.WouldBlock:
            await self._lock.acquire()
        try:
            with trio.fail_after(timeout):
                return await self._request(key, version, body)
        except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            await self.aclose()
            raise PeerError(f"{self.host}:{self.port}: {type(e).__name__} {e}") from None
        except PeerError:
            await self.aclose()
            raise
        finally:
            self._lock.release()

    async def _request(self, key: int, version: int, body: dict) -> dict:
        return await self._exchange(await self._connect(), key, version, body)

    async def _exchange(self, stream, key: int, version: int, body: dict) -> dict:
        corr = next(_corr) & 0x7FFFFFFF
        data = encode_request(key, version, corr, self.client_id, body)
        # Plain TCP: receive straight into the reader's buffer, sized for the pending frame
        # and reused once the previous response is dropped. (receive_some allocated a fresh
        # 1 MiB bytes per call, page faults and zeroing included, and feed copied it again:
        # a fifth of a follower's CPU at acks=all.) TLS streams hand out decrypted bytes.
        sock = stream.socket if isinstance(stream, trio.SocketStream) else None
        if sock is not None:
            # A request fits the socket buffer: one write(2) without SocketStream.send_all's
            # trip through the scheduler after it (as the server's send_bytes does).
            try:
                data = memoryview(data)[os.write(sock.fileno(), data):]
            except BlockingIOError:
                pass
        if data:
            await stream.send_all(data)
        reader = self._reader
        while True:
            frame = reader.next_frame()
            if frame is not None:
                break
            if sock is not None:
                lowat = reader.low_water_change()   # a large response: woken once per MiB
                if lowat is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, lowat)
                n = await sock.recv_into(reader.get_buffer())
                if not n:
                    raise PeerError(f"{self.host}:{self.port} closed the connection")
                reader.commit(n)
                continue
            data = await stream.receive_some(1 << 20)
            if not data:
                raise PeerError(f"{self.host}:{self.port} closed the connection")
            reader.feed(data)
        a = api(key)
        try:
            got, skip = parse_response_header(frame, key, version)
            if got == corr:
                return a.response.decode(frame[skip:], version, exact=False)
        except Exception as e:  # a peer speaking garbage is an unreachable peer
            raise PeerError(f"undecodable {a.name} response: {e}") from None
        raise PeerError(f"correlation id {got} != {corr}")

    async def aclose(self) -> None:
        if self._stream is not None:
            with trio.CancelScope(shield=True):
                try:
                    await self._stream.aclose()
                except (trio.BrokenResourceError, OSError):
                    pass
            self._stream = None
