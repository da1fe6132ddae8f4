"""The ASGI app behind --http-listen and the task that serves it.

hypercorn's Trio worker runs inside the broker's own nursery: one event loop, one task
per HTTP connection, exactly like the Kafka listeners. Routes:

    GET /metrics                                   Prometheus text format (metrics.py)
    GET /status.json[?scope=local]                 the cluster as this broker sees it (status.py)
    GET /                                          the status page
    GET /topics/T/partitions/P/records?...         the HTTP tail (tail.py)

Errors are JSON {"error": <Kafka error name or HTTP reason>, "message": ...} with a 4xx
status; nothing a client sends produces a traceback.
"""
from __future__ import annotations

import json
import logging
import socket
from urllib.parse import parse_qs, unquote

import trio

from ..security.acl import Operation, ResourceType
from . import auth, metrics, status, tail

log = logging.getLogger("canopy.http")


def _json_bytes(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


async def _respond(send, status_code: int, body: bytes, content_type: str) -> None:
    await send({"type": "http.response.start", "status": status_code,
                "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": body})


async def _error(send, status_code: int, error: str, message: str, **extra) -> None:
    await _respond(send, status_code, _json_bytes({"error": error, "message": message, **extra}) + b"\n",
                   "application/json")


class App:
    def __init__(self, broker):
        self.broker = broker
        self.registry = metrics.make_registry(broker)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        try:
            await self.route(scope, receive, send)
        except auth.Refused as e:
            if e.challenge:
                body = _json_bytes({"error": e.error, "message": str(e)}) + b"\n"
                await send({"type": "http.response.start", "status": e.status,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode()),
                                        (b"www-authenticate", b'Basic realm="canopy"')]})
                await send({"type": "http.response.body", "body": body})
            else:
                await _error(send, e.status, e.error, str(e))
        except tail.BadRequest as e:
            await _error(send, e.status, e.error, str(e), **e.extra)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except Exception:
            # A bug must cost one response, never the broker (and never show a traceback).
            log.exception("HTTP %s %s failed", scope.get("method"), scope.get("path"))
            try:
                await _error(send, 500, "INTERNAL_SERVER_ERROR", "the broker failed to answer; see its log")
            except Exception:
                pass

    async def route(self, scope, receive, send) -> None:
        path = scope["path"]
        method = scope["method"]
        if method not in ("GET", "HEAD"):
            await _error(send, 405, "METHOD_NOT_ALLOWED", f"{method} is not served; use GET")
            return
        query = scope.get("query_string", b"")
        headers = scope.get("headers", [])
        principal = await auth.principal_of(self.broker, headers)   # auth.Refused -> 401
        host = (scope.get("client") or ("",))[0]
        if path.startswith("/topics/"):
            pass   # READ on the topic, checked below once the path is parsed
        else:
            auth.authorize(self.broker, principal, host, Operation.DESCRIBE, ResourceType.CLUSTER, "kafka-cluster")
        credentials = dict(headers).get(b"authorization") if principal != auth.ANONYMOUS else None
        if path == "/metrics":
            await _respond(send, 200, metrics.render(self.registry), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/status.json":
            q = parse_qs(query.decode("latin-1"))
            if q.get("scope", ["cluster"])[-1] == "local":
                view = status.local_view(self.broker)
            else:
                view = await status.cluster_view(self.broker, credentials)
            await _respond(send, 200, _json_bytes(view), "application/json")
        elif path in ("/", "/index.html"):
            view = await status.cluster_view(self.broker, credentials)
            await _respond(send, 200, status.render_page(view).encode("utf-8"), "text/html; charset=utf-8")
        elif path.startswith("/topics/"):
            parts = path.split("/")
            # ['', 'topics', T, 'partitions', P, 'records']
            if len(parts) != 6 or parts[3] != "partitions" or parts[5] != "records":
                await _error(send, 404, "NOT_FOUND", "expected /topics/TOPIC/partitions/PARTITION/records")
                return
            auth.authorize(self.broker, principal, host, Operation.READ, ResourceType.TOPIC, unquote(parts[2]))
            await self.tail(unquote(parts[2]), unquote(parts[4]), query, receive, send)
        else:
            await _error(send, 404, "NOT_FOUND", f"no such page {path!r}; try /, /status.json, /metrics "
                                                 "or /topics/T/partitions/P/records")

    async def tail(self, topic: str, partition: str, query: bytes, receive, send) -> None:
        req = tail.TailRequest(self.broker, topic, partition, query)   # BadRequest -> 4xx
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/x-ndjson"), (b"cache-control", b"no-store")]})
        disconnected = trio.Event()

        async def chunk(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        async with trio.open_nursery() as nursery:
            async def watch_disconnect():
                # ASGI tells of a closed client connection through receive().
                while True:
                    msg = await receive()
                    if msg["type"] == "http.disconnect":
                        disconnected.set()
                        nursery.cancel_scope.cancel()
                        return

            nursery.start_soon(watch_disconnect)
            await tail.stream(req, chunk, disconnected)
            nursery.cancel_scope.cancel()
        if not disconnected.is_set():
            await send({"type": "http.response.body", "body": b"", "more_body": False})


def prepare_socket(sock: socket.socket, send_timeout_s: float) -> None:
    """TCP_USER_TIMEOUT on the listening socket (accepted sockets inherit it): the kernel
    drops a connection whose unsent data has waited this long on a zero receive window,
    i.e. a reader that stopped reading. hypercorn writes responses with shielded sends,
    so this is what frees a stalled tail and its buffers."""
    opt = getattr(socket, "TCP_USER_TIMEOUT", None)
    if opt is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, opt, int(send_timeout_s * 1000))
        except OSError:
            pass


async def serve_http(broker, sock: socket.socket, task_status=trio.TASK_STATUS_IGNORED) -> None:
    from hypercorn.config import Config, Sockets
    from hypercorn.trio.run import worker_serve
    from hypercorn.utils import wrap_app

    config = Config()
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = 1.0
    app = App(broker)
    ctx = tls_context(broker.config)
    if ctx is not None:
        config.create_ssl_context = lambda: ctx
        sockets = Sockets([sock], [], [])
    else:
        sockets = Sockets([], [sock], [])
    log.info("HTTP (metrics, status page, tail) on %s://%s:%d/", "https" if ctx else "http", *sock.getsockname()[:2])
    await worker_serve(wrap_app(app, config.wsgi_max_body_size, "asgi"), config,
                       sockets=sockets, task_status=task_status)


def tls_context(config):
    """The HTTP port is no more open than the Kafka listeners: when every listener is SSL
    or SASL_SSL, it serves HTTPS with the same certificate, truststore and ssl-client-auth (so with
    `required`, only clients with a certificate the broker trusts read /metrics or tail a
    partition). With a PLAINTEXT listener anyone can read the records over Kafka anyway,
    and brokers of a cluster talk PLAINTEXT, so the port stays plain HTTP."""
    listeners = config.listener_config.listeners
    if not listeners or any(x.security_protocol not in ("SSL", "SASL_SSL") for x in listeners):
        return None   # (SASL_SSL too: HTTP Basic passwords never cross in the clear where Kafka's do not)
    from ..security.tls import server_context
    ctx = server_context(config.ssl_keystore_location, config.ssl_key_password, config.ssl_truststore_location,
                         config.ssl_client_auth)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx
