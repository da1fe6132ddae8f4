"""The Trio server: one socket per listener, one task per connection, requests answered in order.

Clients rely on responses arriving in request order, and Kafka processes one request per
connection at a time (the socket server mutes a channel until its response is sent). So
a connection task reads a frame, runs its handler, writes the response, and only then
looks at the next frame; pipelined requests wait in the FrameReader's buffer.

One exception, for Produce: a handler whose last step only waits (acks=all for the ISR,
`--flush always` for the group commit) returns a ``Pending``. Its wait runs in a task of
the connection's own while the connection reads the next request; responses are still
written strictly in request order by one writer task. Only Produce requests are read past
a pending one (up to MAX_PIPELINED of them): their appends happen in request order, as
they would one by one. Any other request waits until every earlier response is written,
so it sees exactly what it would have seen on Kafka. Without this, a producer's
acks=all throughput is one batch per replication round trip.
"""
from __future__ import annotations

import errno
import gc
import logging
import os
import signal
import socket
import time
from functools import partial
from itertools import count

import trio

from protocol.framing import FrameReader, FrameTooLarge, frame, parse_request_header, response_header
from protocol.messages import ApiKey, api
from protocol.schema import ExternalBytes, SchemaError

from storage import LogOffline

from . import cold_reads
from .broker import Broker, Pending
from .config import BrokerConfig
from .handlers import HANDLERS, build_codecs
from .handlers.api_versions import unsupported_version_response

log = logging.getLogger("canopy.server")

_conn_ids = count(1)

# Slow readers are cut off rather than buffered for (seed 000: "if a non-blocking write
# is unable to write data, we just drop the connection"): a response goes out straight
# from its encoded bytes and the segment files, never queued per connection, so each
# connection holds at most one response being written (plus up to MAX_PIPELINED Produce
# answers waiting their turn: small dicts, no record bytes); one that makes no progress for this long —
# the socket buffer full because the client stopped reading — closes the connection.
SEND_TIMEOUT_S = int(os.environ.get("CANOPY_SEND_TIMEOUT_MS", "30000")) / 1000
# A connection idle this long gives back its receive buffer (16 KiB, up to 256 KiB or its
# largest frame once one did not fit); thousands of idle clients then cost a socket and a
# task each.
IDLE_RELEASE_S = 5.0
# Produce requests of one connection whose ISR/fsync waits may run at once (librdkafka and
# the Java producer keep up to 5 in flight with idempotence, more without).
MAX_PIPELINED = 16
# A Fetch response whose record bytes total at most this much goes out as one write, the
# records copied into it, instead of header, sendfile and tail as three: a replica or a
# consumer long-polling for the newest records gets a few hundred bytes per response, and
# each extra send on loopback is a syscall (and may wake the reader for a frame it cannot
# use yet). Larger responses stay zero-copy.
SMALL_RESPONSE_COPY = 64 << 10


class StalledReader(Exception):
    """The peer accepted no bytes for SEND_TIMEOUT_S."""


class StartupError(Exception):
    """Printed by the CLI as one line (busy port, locked data directory, ...)."""


class RequestContext:
    __slots__ = ("broker", "header", "connection")

    def __init__(self, broker: Broker, header, connection: "Connection"):
        self.broker = broker
        self.header = header
        self.connection = connection

    def allowed(self, operation, resource_type, name: str = "kafka-cluster") -> bool:
        """May this connection's principal perform ``operation`` on the resource? Always
        True without an authorizer (broker/security/acl.py has the rules)."""
        acls = self.broker.acls
        if not acls.enabled:
            return True
        c = self.connection
        return acls.current().authorize(c.principal, c.host, operation, resource_type, name)

    def may_write_some_topic(self) -> bool:
        """InitProducerId for an idempotent producer: IDEMPOTENT_WRITE on the cluster, or
        WRITE on at least one topic (Kafka's authorizeByResourceType)."""
        from .security.acl import Operation, ResourceType
        acls = self.broker.acls
        if not acls.enabled or self.allowed(Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER):
            return True
        c = self.connection
        return acls.current().authorize_any(c.principal, c.host, Operation.WRITE, ResourceType.TOPIC)

    def authorized_operations(self, resource_type, name: str = "kafka-cluster") -> int:
        """Kafka's authorized_operations bit set for the resource (every operation the
        resource type has when no authorizer is configured, as Kafka answers)."""
        from .security.acl import all_operations
        acls = self.broker.acls
        if not acls.enabled:
            return all_operations(resource_type)
        c = self.connection
        return acls.current().authorized_operations(c.principal, c.host, resource_type, name)


class Connection:
    # Who the client is: User:ANONYMOUS on a PLAINTEXT listener, the certificate's subject
    # after an mTLS handshake (security/tls.py), User:<name> after SASL (security/sasl.py).
    principal = "User:ANONYMOUS"
    # Receive low-water marks for large requests (see set_low_water; not under TLS).
    low_water_enabled = True

    def __init__(self, broker: Broker, stream: trio.SocketStream, listener: str = "PLAINTEXT"):
        self.broker = broker
        self.stream = stream
        # The listener the connection arrived on: Metadata, FindCoordinator and
        # DescribeCluster answer with the other brokers' endpoints on this listener.
        self.listener = listener
        self.id = next(_conn_ids)
        try:
            self.host, port = stream.socket.getpeername()[:2]
            self.peer = "%s:%s" % (self.host, port)
        except OSError:
            self.peer = self.host = "?"
        # Allocated when the first bytes arrive and dropped again while idle.
        self.reader: FrameReader | None = None
        # Pipelined Produce answers (see the module doc): the writer task and its queue are
        # made when the first Pending arrives; `_queued` counts responses not yet written.
        self._nursery: trio.Nursery | None = None
        self._responses: trio.MemorySendChannel | None = None
        self._queued = 0
        self._drained = trio.Event()

    async def wait_readable(self) -> None:
        await trio.lowlevel.wait_readable(self.stream.socket)

    async def recv_into(self, buffer) -> int:
        return await self.stream.socket.recv_into(buffer)

    def set_low_water(self, n: int) -> None:
        """Be woken only once ``n`` bytes wait in the socket (SO_RCVLOWAT; see
        FrameReader.receive_low_water)."""
        if self.low_water_enabled:
            self.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, n)

    async def run(self) -> None:
        stats = self.broker.stats
        stats.connections_open += 1
        stats.connections_total += 1
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await self._read_requests()
                nursery.cancel_scope.cancel()   # the connection is done: drop pending answers
        finally:
            stats.connections_open -= 1
            with trio.CancelScope(shield=True):
                await self.stream.aclose()

    async def _read_requests(self) -> None:
        stats = self.broker.stats
        try:
            while True:
                if self.reader is None:
                    await self.wait_readable()
                    self.reader = FrameReader(self.broker.config.max_request_bytes)
                request = self.reader.next_frame()
                if request is None:
                    lowat = self.reader.low_water_change()
                    if lowat is not None:
                        self.set_low_water(lowat)
                    # Receive straight into the reader's buffer: a large Produce is copied
                    # once by the kernel here and once by storage into the segment.
                    if self.reader.buffered == 0:
                        with trio.move_on_after(IDLE_RELEASE_S):
                            n = await self.recv_into(self.reader.get_buffer())
                            if not n:
                                return
                            self.reader.commit(n)
                            continue
                        self.reader = None  # idle: release the buffer
                        continue
                    n = await self.recv_into(self.reader.get_buffer())
                    if not n:
                        return
                    self.reader.commit(n)
                    continue
                if not await self.process(request):
                    stats.connection_failures += 1   # process() logged why
                    return
        except Exception as e:
            self._closing(e, f"connection {self.id} from {self.peer} failed; closing it")

    def _closing(self, e: Exception, bug: str) -> None:
        """Count and log what ends the connection: one line for a frame too large or a
        stalled reader, nothing for a peer that went away, ``bug`` with the traceback for
        anything else. A bug reached by one client's bytes (e.g. a response that cannot be
        encoded) must cost that connection, never the broker: an exception escaping a
        connection's task would cancel the whole server nursery."""
        if isinstance(e, (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError)):
            return
        self.broker.stats.connection_failures += 1
        if isinstance(e, (FrameTooLarge, StalledReader)):
            log.warning("closing connection %s from %s: %s", self.id, self.peer, e)
        else:
            log.error("%s", bug, exc_info=e)

    async def process(self, request: memoryview) -> bool:
        """Handle one request frame. Returns False when the connection must close."""
        try:
            header, body_at = parse_request_header(request)
        except SchemaError as e:
            log.warning("closing connection %s from %s: malformed request header (%s)", self.id, self.peer, e)
            return False
        key, version = header.api_key, header.api_version
        if self._queued and key != ApiKey.PRODUCE:
            # Only Produce is read past a pending answer (module doc): anything else runs
            # once every earlier response is written, as on Kafka.
            await self._drained.wait()
        handler = HANDLERS.get(key)
        if handler is None or not handler.MIN_VERSION <= version <= handler.MAX_VERSION:
            if key == ApiKey.API_VERSIONS:
                # KIP-511: answer an unknown ApiVersions version with error 35 in a v0 body
                # so the client can retry with a version from the list.
                await self.send_bytes(unsupported_version_response(header.correlation_id))
                return True
            what = "unknown API key" if handler is None else "unsupported version"
            log.warning("closing connection %s from %s (client %r): %s %d v%d",
                        self.id, self.peer, header.client_id, what, key, version)
            return False
        try:
            # Like Kafka's own request parsing, bytes left after the schema's last field are
            # ignored: librdkafka 2.16 sends 3 such bytes in its all-topics Metadata v12.
            body = api(key).request.decode(request[body_at:], version, exact=False)
        except SchemaError as e:
            log.warning("closing connection %s from %s (client %r): malformed %s v%d request: %s",
                        self.id, self.peer, header.client_id, api(key).name, version, e)
            return False
        ctx = RequestContext(self.broker, header, self)
        started = time.perf_counter()
        try:
            response = await handler.handle(ctx, body, version)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise
        except LogOffline as e:
            # The fsync a `--flush always` request waited for failed: its records are not
            # durable, so it gets no answer at all rather than a success. The client
            # retries on a new connection and meets the offline log's KAFKA_STORAGE_ERROR.
            log.warning("closing connection %s from %s: %s v%d not acknowledged: %s",
                        self.id, self.peer, api(key).name, version, e)
            return False
        except Exception:
            log.exception("handler for %s v%d failed; closing connection %s",
                          api(key).name, version, self.id)
            return False
        if response is None:  # acks=0 produce: Kafka sends nothing back
            self.broker.stats.requests.record(key, time.perf_counter() - started, None)
            return True
        if self._queued or isinstance(response, Pending):
            await self._queue_response(header, key, version, started, response)
            return True
        await self.send_response(header, key, version, response)
        # Kafka's TotalTimeMs: from the request read to its response written.
        self.broker.stats.requests.record(key, time.perf_counter() - started, response)
        return True

    async def _queue_response(self, header, key: int, version: int, started: float, response) -> None:
        if self._responses is None:
            self._responses, receive = trio.open_memory_channel(MAX_PIPELINED)
            self._nursery.start_soon(self._write_in_order, receive)
        if self._queued == 0:
            self._drained = trio.Event()
        self._queued += 1
        if isinstance(response, Pending):
            self._nursery.start_soon(response.run)
        # Blocks while MAX_PIPELINED answers wait: the next request is then not read.
        await self._responses.send((header, key, version, started, response))

    async def _write_in_order(self, receive: trio.MemoryReceiveChannel) -> None:
        """The writer task: queued responses in request order, each once it is complete."""
        stats = self.broker.stats
        try:
            async for header, key, version, started, response in receive:
                if isinstance(response, Pending):
                    await response.done.wait()
                    if response.error is not None:
                        raise response.error
                    response = response.response
                await self.send_response(header, key, version, response)
                stats.requests.record(key, time.perf_counter() - started, response)
                self._queued -= 1
                if not self._queued:
                    self._drained.set()
            return
        except LogOffline as e:
            # As in process(): the fsync the request waited for failed, so it gets no answer.
            stats.connection_failures += 1
            log.warning("closing connection %s from %s: %s v%d not acknowledged: %s",
                        self.id, self.peer, api(key).name, version, e)
        except Exception as e:
            self._closing(e, f"handler for {api(key).name} v{version} failed; closing connection {self.id}")
        self._nursery.cancel_scope.cancel()

    async def send_response(self, header, key: int, version: int, body: dict) -> None:
        a = api(key)
        payload, external = a.response.encode_external(body, version)
        head = response_header(header.correlation_id, a.response_header_version(version))
        if not external:
            await self.send_bytes(frame(head, payload))
            return
        records = sum(ext.size for _, ext in external)
        total = len(head) + len(payload) + records
        prefix = total.to_bytes(4, "big") + head
        if records <= SMALL_RESPONSE_COPY and await self._send_copied(prefix, payload, external, 4 + total):
            return
        at = 0
        pending = prefix
        for pos, ext in external:
            await self.send_bytes(pending + payload[at:pos])
            pending = b""
            await self.send_external(ext)
            at = pos
        await self.send_bytes(payload[at:])

    async def _send_copied(self, prefix: bytes, payload: bytes, external: list, size: int) -> bool:
        """Send the whole ``size``-byte frame in one write, the record bytes read straight
        into it (a worker thread reads cold ones: cold_reads.read_regions); False, having
        sent nothing, when a segment reads short."""
        frame_buf = bytearray(size)
        view = memoryview(frame_buf)
        view[:len(prefix)] = prefix
        filled, at = len(prefix), 0
        try:
            for pos, ext in external:
                piece = payload[at:pos]
                view[filled:filled + len(piece)] = piece
                filled += len(piece)
                if not await cold_reads.read_regions(ext.source.regions, view[filled:filled + ext.size]):
                    return False   # the zero-copy path sends (and releases) them instead
                filled += ext.size
                at = pos
        except BaseException:
            for _, ext in external:
                ext.source.release()
            raise
        for _, ext in external:
            ext.source.release()
        view[filled:] = payload[at:]
        await self.send_bytes(frame_buf)
        return True

    async def send_bytes(self, data: bytes) -> None:
        if not data:
            return
        sock = self.stream.socket
        view = memoryview(data)
        try:
            # Usually the whole response fits the socket buffer: one write(2), no cancel
            # scope, no trip through the scheduler (the W2 round-trip profile's 8%).
            view = view[os.write(sock.fileno(), view):]
        except BlockingIOError:
            pass
        except OSError as e:
            raise trio.BrokenResourceError from e
        while view:
            with trio.move_on_after(SEND_TIMEOUT_S):
                try:
                    sent = await sock.send(view)
                except OSError as e:
                    raise trio.BrokenResourceError from e
                view = view[sent:]
                continue
            raise StalledReader(f"peer read nothing for {SEND_TIMEOUT_S:g} s; "
                                f"{len(view)} bytes of a response unsent")

    async def send_external(self, ext: ExternalBytes) -> None:
        """Record batches straight from segment files to the socket (zero-copy). A chunk
        not in the page cache is read in by a worker thread first (broker/cold_reads.py):
        sendfile of cold pages would wait for the disk on the event loop and stall every
        connection."""
        sock = self.stream.socket
        try:
            for fd, region_pos, region_size in ext.source.regions:
                for position, size, rest in cold_reads.chunks(region_pos, region_size):
                    await cold_reads.ensure_cached(fd, position, size, ahead=min(rest, cold_reads.CHUNK))
                    while size > 0:
                        try:
                            sent = os.sendfile(sock.fileno(), fd, position, min(size, cold_reads.SEND_SLICE))
                        except BlockingIOError:
                            with trio.move_on_after(SEND_TIMEOUT_S):
                                await sock.wait_writable()
                                continue
                            raise StalledReader(f"peer read nothing for {SEND_TIMEOUT_S:g} s "
                                                f"during a fetch ({size} record bytes unsent)")
                        except OSError as e:
                            if e.errno in (errno.EPIPE, errno.ECONNRESET):
                                raise trio.BrokenResourceError from e
                            raise
                        if sent == 0:
                            # The file is shorter than the index promised (segment truncated
                            # under us): the frame can no longer be completed, so drop the
                            # connection.
                            raise trio.BrokenResourceError("segment shrank during sendfile")
                        position += sent
                        size -= sent
                        if size or rest:
                            # Loopback sockets take megabytes per call: let the other
                            # connections' requests in between slices (W2's round trip must
                            # not queue behind a catch-up consumer's whole fetch).
                            await trio.lowlevel.checkpoint()
        finally:
            # Unpins the segments (a deleted one's fds close now), also when the peer went
            # away or the request was cancelled mid-response.
            ext.source.release()


async def _serve_async(config: BrokerConfig, listener_socks: dict[str, trio.socket.SocketType], broker: Broker,
                       task_status=trio.TASK_STATUS_IGNORED, http_sock: socket.socket | None = None) -> None:
    classes = connection_classes(config, broker)

    def handler_for(name: str):
        cls = classes[name]

        async def handle(stream: trio.SocketStream) -> None:
            await cls(broker, stream, name).run()
        return handle

    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run_background)
        nursery.start_soon(_watch_signals, nursery.cancel_scope)
        if http_sock is not None:
            from .http.app import serve_http
            await nursery.start(serve_http, broker, http_sock)
        lc = config.listener_config
        log.info("canopy node %d serving on %s (advertised %s; inter-broker %s), data in %s, flush=%s",
                 config.node_id, ", ".join(map(str, lc.listeners)),
                 ", ".join("%s://%s:%d" % (n, *a) for n, a in lc.advertised.items()), lc.inter_broker,
                 config.data_dir, config.flush)
        task_status.started()
        for name, sock in listener_socks.items():
            nursery.start_soon(partial(trio.serve_listeners, handler_for(name), [trio.SocketListener(sock)],
                                       handler_nursery=nursery))


def connection_classes(config: BrokerConfig, broker: Broker) -> dict[str, type]:
    """The connection class of each listener: plaintext (zero-copy), TLS, SASL over
    plaintext, or SASL inside TLS."""
    out = {}
    for lst in config.listener_config.listeners:
        proto = lst.security_protocol
        cls = Connection
        if proto in ("SASL_PLAINTEXT", "SASL_SSL"):
            from .security.sasl import sasl_connection_class
            cls = sasl_connection_class(cls, config.sasl_mechanisms, broker.credentials.lookup, proto)
        if proto in ("SSL", "SASL_SSL"):
            from .security.tls import tls_connection_class
            cls = tls_connection_class(cls, config.ssl_context)
        out[lst.name] = cls
    return out


async def _watch_signals(cancel_scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("received %s, shutting down", signal.Signals(signum).name)
            cancel_scope.cancel()
            return


def bind_listeners(config: BrokerConfig) -> dict[str, socket.socket]:
    """One bound socket per listener; all or nothing."""
    out: dict[str, socket.socket] = {}
    try:
        for lst in config.listener_config.listeners:
            out[lst.name] = bind_listener(lst.host, lst.port)
    except BaseException:
        for sock in out.values():
            sock.close()
        raise
    return out


def bind_listener(host: str, port: int) -> socket.socket:
    try:
        # An empty host (Kafka's `PLAINTEXT://:9092`) means every interface.
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise StartupError(f"cannot resolve listen address {host!r}: {e.strerror}") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise StartupError(f"cannot listen on {host}:{port}: address already in use") from None
        raise StartupError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(1024)
    return sock


def _return_big_buffers_to_the_os() -> None:
    """Fix glibc's mmap threshold at 128 KiB. By default it rises to the size of the
    largest buffer freed, after which 256 KiB receive buffers come from the heap and an
    idle connection's released buffer is never given back: 2 000 connections that
    spoke once would hold ~500 MB. Fixed, such buffers are mmap'd and munmap'd."""
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        M_MMAP_THRESHOLD = -3
        libc.mallopt(M_MMAP_THRESHOLD, 128 * 1024)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to tune


def serve(config: BrokerConfig) -> None:
    """Run a broker until SIGTERM/SIGINT. Raises StartupError for user-facing problems."""
    from storage import DataDirLock, DataDirLocked

    _return_big_buffers_to_the_os()

    data_dir = config.data_dir
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StartupError(f"cannot create data directory {data_dir}: {e.strerror}") from None
    try:
        lock = DataDirLock(data_dir)
    except DataDirLocked as e:
        raise StartupError(str(e)) from None
    http_sock = None
    try:
        if config.http_listen:
            # Bound before the Kafka listeners: whoever sees the Kafka port open finds the
            # HTTP port open too.
            from .config import parse_hostport
            from .http.app import prepare_socket
            http_sock = bind_listener(*parse_hostport(config.http_listen, "http-listen"))
            prepare_socket(http_sock, SEND_TIMEOUT_S)
        try:
            raw = bind_listeners(config)
        except BaseException:
            if http_sock is not None:
                http_sock.close()
            raise
        try:
            broker = Broker(config)
            build_codecs()
            # Everything made so far (imports, codecs, every loaded partition) lives as
            # long as the process: move it out of the collector's view. Otherwise the first
            # full collection, set off by the next burst of allocations (CreateTopics of
            # 1 000 partitions), walks it all: 20-35 ms with every connection stalled.
            gc.freeze()
            try:
                trio.run(_run, config, raw, broker, http_sock)
            finally:
                broker.close()
        finally:
            for sock in raw.values():
                sock.close()
            if http_sock is not None:
                http_sock.close()
    finally:
        lock.release()


async def _run(config: BrokerConfig, raw: dict[str, socket.socket], broker: Broker,
               http_sock: socket.socket | None = None) -> None:
    from .cluster import StoreUnavailable
    try:
        await broker.cluster.connect()
    except StoreUnavailable as e:
        raise StartupError(str(e)) from None
    try:
        await _serve_async(config, {name: trio.socket.from_stdlib_socket(sock) for name, sock in raw.items()},
                           broker, http_sock=http_sock)
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(2):
            await broker.cluster.aclose()
