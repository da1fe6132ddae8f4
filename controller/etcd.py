"""A small etcd v3 client over etcd's JSON gateway (HTTP/1.1 + JSON), on Trio through httpx.

canopy keeps its cluster metadata and controller election in etcd (docs/etcd.md). etcd 3.4
serves its gRPC API as JSON on the client port; the gateway's conventions shape this module:

- keys and values are base64 strings; int64 fields (revisions, lease ids, TTLs) are JSON
  strings; a field that is zero, false or empty is left out (proto3 JSON), so every read
  defaults to 0 / False / b"".
- errors come back as ``{"error": ..., "message": ..., "code": <gRPC code>}`` with an HTTP
  status; streamed calls (watch, lease keepalive) wrap messages in ``{"result": ...}`` and
  errors in ``{"error": {"grpc_code": ..., "message": ...}}``.
- every request carries the gRPC metadata ``hasleader=true`` (header
  ``Grpc-Metadata-hasleader``): a member cut off from the quorum then answers
  "etcdserver: no leader" at once instead of holding a write for its own 7 s request
  timeout, so the client fails over to another member quickly.

Several endpoints: requests go to the current one; a connection error, a timeout or an
answer meaning "this member cannot reach a leader" moves to the next and retries, at most
once per endpoint, then :class:`EtcdUnavailable` is raised. Any other error answer is an
:class:`EtcdError` and is not retried. A timed-out write may still be applied by etcd later:
callers guard writes that matter with a :meth:`EtcdClient.txn` compare, which makes the
retry on another member safe (it fails its compare instead of applying twice).
"""
from __future__ import annotations

import base64
import json
import re
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio

# httpx (with httpcore, h11, anyio, idna and certifi: ~20 ms warm, ~50 ms from a cold page
# cache) is imported by the methods that use it, so that a single-node broker, which never
# talks to etcd but imports this module for its error types, does not pay for it at start.

__all__ = [
    "EtcdError", "EtcdUnavailable", "WatchCompacted", "KeyValue", "Compare", "Op",
    "TxnResult", "WatchEvent", "EtcdClient", "Watch", "parse_endpoints", "prefix_range_end",
]

# Answers that mean "this member cannot serve the request right now", not "the request is
# wrong": gRPC UNAVAILABLE (14: no leader, leader changed, request timed out),
# DEADLINE_EXCEEDED (4), and the gateway's own "context deadline exceeded" (code 2) that a
# minority member answers for writes when the request was sent without hasleader.
_UNAVAILABLE_CODES = {4, 14}
_UNAVAILABLE_MESSAGES = ("no leader", "context deadline exceeded", "request timed out",
                         "leader changed")
_HEADERS = {"Grpc-Metadata-hasleader": "true"}


class EtcdError(Exception):
    """etcd answered with an error (bad request, unknown lease, ...)."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code


class EtcdUnavailable(EtcdError):
    """No endpoint answered usefully: connection refused, timeout, or no leader reachable."""


class WatchCompacted(EtcdError):
    """The watch's start revision has been compacted away; re-read and watch from
    ``compact_revision`` (the oldest revision etcd still has)."""

    def __init__(self, message: str, compact_revision: int):
        super().__init__(message)
        self.compact_revision = compact_revision


# --------------------------------------------------------------------------- encoding

def _key_bytes(key: str | bytes) -> bytes:
    return key if isinstance(key, bytes) else key.encode()


def _b64(data: str | bytes) -> str:
    return base64.b64encode(_key_bytes(data)).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def _int(d: dict, name: str) -> int:
    return int(d.get(name) or 0)


def prefix_range_end(prefix: str | bytes) -> bytes:
    """The range_end that makes a range cover every key starting with ``prefix``: the
    prefix with its last byte incremented (trailing 0xff bytes dropped first). The empty
    prefix (and an all-0xff one) gives b"\\x00", etcd's "to the end of the keyspace"."""
    p = bytearray(_key_bytes(prefix))
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return b"\x00"
    p[-1] += 1
    return bytes(p)


def _range_fields(key: str | bytes, prefix: bool) -> dict:
    k = _key_bytes(key)
    if not prefix:
        return {"key": _b64(k)}
    # etcd refuses an empty key; key "\0" with range_end "\0" means every key.
    return {"key": _b64(k or b"\x00"), "range_end": _b64(prefix_range_end(k))}


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def from_json(cls, d: dict) -> "KeyValue":
        return cls(key=_unb64(d.get("key")).decode("utf-8", "replace"),
                   value=_unb64(d.get("value")),
                   create_revision=_int(d, "create_revision"),
                   mod_revision=_int(d, "mod_revision"),
                   version=_int(d, "version"),
                   lease=_int(d, "lease"))


_COMPARE_OPS = {"=": "EQUAL", "!=": "NOT_EQUAL", ">": "GREATER", "<": "LESS"}


def _compare(key, op: str, target: str, field_name: str, value) -> dict:
    try:
        result = _COMPARE_OPS[op]
    except KeyError:
        raise ValueError(f"compare operator {op!r} is not one of = != > <") from None
    return {"key": _b64(key), "target": target, "result": result, field_name: value}


class Compare:
    """Builders for txn comparisons (etcd's Compare message)."""

    @staticmethod
    def create_revision(key, op: str, value: int) -> dict:
        # create_revision == 0 means "the key does not exist".
        return _compare(key, op, "CREATE", "create_revision", str(int(value)))

    @staticmethod
    def mod_revision(key, op: str, value: int) -> dict:
        return _compare(key, op, "MOD", "mod_revision", str(int(value)))

    @staticmethod
    def version(key, op: str, value: int) -> dict:
        return _compare(key, op, "VERSION", "version", str(int(value)))

    @staticmethod
    def value(key, op: str, value: bytes) -> dict:
        return _compare(key, op, "VALUE", "value", _b64(value))

    @staticmethod
    def lease(key, op: str, value: int) -> dict:
        return _compare(key, op, "LEASE", "lease", str(int(value)))


class Op:
    """Builders for txn operations (etcd's RequestOp message)."""

    @staticmethod
    def put(key, value: bytes, lease: int = 0) -> dict:
        body = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(int(lease))
        return {"request_put": body}

    @staticmethod
    def delete(key, prefix: bool = False) -> dict:
        return {"request_delete_range": _range_fields(key, prefix)}

    @staticmethod
    def get(key, prefix: bool = False) -> dict:
        return {"request_range": _range_fields(key, prefix)}


@dataclass
class TxnResult:
    succeeded: bool
    revision: int
    # Per op of the branch that ran: list[KeyValue] for a get, etcd's response dict
    # (e.g. {"header": ..., "deleted": "1"}) for a put or a delete.
    responses: list = field(default_factory=list)

    @classmethod
    def from_json(cls, d: dict) -> "TxnResult":
        responses = []
        for r in d.get("responses") or ():
            if "response_range" in r:
                responses.append([KeyValue.from_json(kv) for kv in r["response_range"].get("kvs") or ()])
            elif "response_put" in r:
                responses.append(r["response_put"])
            elif "response_delete_range" in r:
                responses.append(r["response_delete_range"])
            else:
                responses.append(r)
        return cls(succeeded=bool(d.get("succeeded")), revision=_header_revision(d),
                   responses=responses)


@dataclass
class WatchEvent:
    type: str       # "PUT" or "DELETE"
    kv: KeyValue    # for DELETE: key and mod_revision set, value b""


def _header_revision(d: dict) -> int:
    return _int(d.get("header") or {}, "revision")


_HOST_PORT = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.\-]+)):(?P<port>\d+)$")


def parse_endpoints(text: str) -> list[tuple[str, int]]:
    """``"etcd://h1:p1,h2:p2"`` or ``"h1:p1,h2:p2"`` -> [(h1, p1), (h2, p2)].

    Raises ValueError with a one-line message naming the bad part."""
    if not isinstance(text, str):
        raise ValueError(f"etcd endpoints must be a string, not {type(text).__name__}")
    s = text.strip()
    if s.startswith("etcd://"):
        s = s[len("etcd://"):]
    elif "://" in s:
        raise ValueError(f"etcd endpoints {text!r}: expected etcd://host:port[,host:port...]")
    if not s:
        raise ValueError(f"etcd endpoints {text!r}: no host:port given")
    endpoints = []
    for part in s.split(","):
        part = part.strip()
        m = _HOST_PORT.match(part)
        if not m:
            raise ValueError(f"etcd endpoint {part!r} in {text!r} is not host:port")
        port = int(m["port"])
        if not 0 < port < 65536:
            raise ValueError(f"etcd endpoint {part!r}: port {port} out of range 1-65535")
        endpoints.append((m["v6"] or m["host"], port))
    return endpoints


def _endpoint_name(ep: tuple[str, int]) -> str:
    host, port = ep
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _error_of(data: dict) -> tuple[int | None, str] | None:
    """(gRPC code, message) if a gateway answer is an error, else None."""
    if not isinstance(data, dict):
        return None, f"unexpected answer {str(data)[:200]}"
    if "header" in data or "result" in data:
        # LeaseGrantResponse has its own (always empty) "error" field; real answers
        # carry a header.
        return None
    err = data.get("error")
    if isinstance(err, dict):      # streamed calls: {"error": {"grpc_code": 14, "message": ...}}
        return err.get("grpc_code"), str(err.get("message") or err)
    if err is not None or "code" in data:
        return data.get("code"), str(data.get("message") or err)
    return None


def _is_unavailable(code: int | None, message: str) -> bool:
    return code in _UNAVAILABLE_CODES or any(m in message for m in _UNAVAILABLE_MESSAGES)


def _transport_reason(exc: BaseException) -> str:
    # httpx's messages are short ("[Errno 111] Connection refused"); keep them to one line
    # and never pass the exception (and its traceback chain) upward.
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# --------------------------------------------------------------------------- client

class EtcdClient:
    """etcd v3 client for Trio. ``endpoints``: [(host, port), ...] or "etcd://h:p,h:p".

    ``request_timeout`` bounds one attempt against one endpoint; a call that fails over
    through every endpoint can take up to ``len(endpoints) * request_timeout``."""

    def __init__(self, endpoints: list[tuple[str, int]] | str, *, request_timeout: float = 5.0):
        if isinstance(endpoints, str):
            endpoints = parse_endpoints(endpoints)
        endpoints = [(str(h), int(p)) for h, p in endpoints]
        if not endpoints:
            raise ValueError("etcd endpoints: none given")
        self.endpoints: list[tuple[str, int]] = endpoints
        self.request_timeout = float(request_timeout)
        self._current = 0
        import httpx
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(self.request_timeout),
            # A watch holds one connection for as long as it runs.
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=16),
            headers=_HEADERS)

    @property
    def current_endpoint(self) -> str:
        return _endpoint_name(self.endpoints[self._current])

    def _url(self, ep: tuple[str, int], path: str) -> str:
        return f"http://{_endpoint_name(ep)}{path}"

    def _failed(self, index: int) -> None:
        # Move on only if nobody else has already moved us: concurrent calls that failed
        # on the same endpoint should advance once, not skip a healthy member.
        if self._current == index:
            self._current = (index + 1) % len(self.endpoints)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "EtcdClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def _post_once(self, ep: tuple[str, int], path: str, body: dict,
                         headers: dict | None = None) -> tuple[str, object]:
        """One attempt: ("ok", answer), ("error", (code, message)) or ("down", reason)."""
        import httpx
        name = _endpoint_name(ep)
        with trio.move_on_after(self.request_timeout) as scope:
            try:
                resp = await self._http.post(self._url(ep, path), json=body, headers=headers)
            except httpx.TimeoutException:
                return "down", f"{name}: timed out after {self.request_timeout:g}s"
            except httpx.HTTPError as e:
                return "down", f"{name}: {_transport_reason(e)}"
        if scope.cancelled_caught:
            return "down", f"{name}: timed out after {self.request_timeout:g}s"
        try:
            data = resp.json()
        except ValueError:
            text = resp.text.strip().splitlines()[0][:200] if resp.text.strip() else ""
            return "error", (None, f"{name}{path}: HTTP {resp.status_code} {text}")
        err = _error_of(data)
        if err is None:
            return "ok", data
        code, message = err
        if _is_unavailable(code, message):
            return "down", f"{name}: {message}"
        return "error", (code, f"{name}: {message}")

    async def _call(self, path: str, body: dict, *, headers: dict | None = None) -> dict:
        reasons = []
        for _ in range(len(self.endpoints)):
            index = self._current
            status, payload = await self._post_once(self.endpoints[index], path, body, headers)
            if status == "ok":
                return payload
            if status == "error":
                code, message = payload
                raise EtcdError(message, code)
            reasons.append(payload)
            self._failed(index)
        raise EtcdUnavailable("etcd unavailable: " + "; ".join(reasons))

    # ------------------------------------------------------------------ KV

    async def get(self, key) -> KeyValue | None:
        d = await self._call("/v3/kv/range", {"key": _b64(key)})
        kvs = d.get("kvs") or ()
        return KeyValue.from_json(kvs[0]) if kvs else None

    async def get_prefix(self, prefix) -> tuple[list[KeyValue], int]:
        """Every key under ``prefix`` sorted by key, and the revision they were read at
        (watch from revision + 1 to see every change after this read)."""
        body = _range_fields(prefix, True)
        body.update(sort_order="ASCEND", sort_target="KEY")
        d = await self._call("/v3/kv/range", body)
        return [KeyValue.from_json(kv) for kv in d.get("kvs") or ()], _header_revision(d)

    async def put(self, key, value: bytes, lease: int = 0) -> int:
        body = Op.put(key, value, lease)["request_put"]
        return _header_revision(await self._call("/v3/kv/put", body))

    async def delete(self, key, prefix: bool = False) -> int:
        d = await self._call("/v3/kv/deleterange", _range_fields(key, prefix))
        return _int(d, "deleted")

    async def txn(self, compare: list, success: list, failure: list = ()) -> TxnResult:
        d = await self._call("/v3/kv/txn", {"compare": list(compare), "success": list(success),
                                            "failure": list(failure)})
        return TxnResult.from_json(d)

    # ------------------------------------------------------------------ leases

    async def lease_grant(self, ttl_s: int) -> int:
        d = await self._call("/v3/lease/grant", {"TTL": str(int(ttl_s))})
        return _int(d, "ID")

    async def lease_keepalive(self, lease_id: int) -> int:
        """Refresh the lease once; returns its TTL in seconds, 0 if the lease is gone
        (expired or revoked) — etcd answers a keepalive of an unknown lease with TTL 0."""
        d = await self._call("/v3/lease/keepalive", {"ID": str(int(lease_id))})
        return _int(d.get("result") or {}, "TTL")

    async def lease_revoke(self, lease_id: int) -> None:
        """Revoke the lease and delete its keys. A lease that is already gone is not an
        error: the caller wanted it gone."""
        try:
            await self._call("/v3/lease/revoke", {"ID": str(int(lease_id))})
        except EtcdUnavailable:
            raise
        except EtcdError as e:
            if "lease not found" not in str(e):
                raise

    async def lease_ttl(self, lease_id: int) -> int:
        """Remaining TTL in seconds; -1 if the lease expired or never existed."""
        d = await self._call("/v3/lease/timetolive", {"ID": str(int(lease_id))})
        if "TTL" in d:
            return int(d["TTL"])
        # proto3 leaves out a zero TTL: a live lease in its last second still reports
        # grantedTTL; an unknown one answers TTL "-1".
        return 0 if "grantedTTL" in d else -1

    # ------------------------------------------------------------------ watch

    def watch(self, prefix, start_revision: int, *, liveness_interval: float | None = None) -> "Watch":
        """Watch every key under ``prefix`` from ``start_revision`` (inclusive)::

            async with client.watch("/canopy/brokers/", rev + 1) as events_stream:
                async for events in events_stream:    # one list per etcd watch response
                    ...

        Raises EtcdUnavailable when the stream breaks or its member stops answering (re-watch
        from ``w.next_revision``, the last seen mod_revision + 1: the next attempt starts on
        another member), and
        WatchCompacted if ``start_revision`` is older than etcd's compaction."""
        return Watch(self, prefix, start_revision, liveness_interval)

    # ------------------------------------------------------------------ health

    async def health(self) -> list[dict]:
        """One dict per endpoint: {"endpoint", "healthy", "leader", "error"}; never raises.
        healthy: /health says true (the member has a leader and serves reads); leader: the
        member is the Raft leader (from /v3/maintenance/status)."""
        results: list[dict] = [None] * len(self.endpoints)

        async def probe(i: int, ep: tuple[str, int]) -> None:
            import httpx
            name = _endpoint_name(ep)
            info = {"endpoint": name, "healthy": False, "leader": False, "error": None}
            try:
                with trio.fail_after(self.request_timeout):
                    r = await self._http.get(self._url(ep, "/health"))
                    try:
                        h = r.json()
                    except ValueError:
                        h = {}
                    info["healthy"] = str(h.get("health")) == "true"
                    # Without hasleader: a member without a leader still reports its state.
                    r = await self._http.post(self._url(ep, "/v3/maintenance/status"), json={},
                                              headers={"Grpc-Metadata-hasleader": "false"})
                    s = r.json()
                    err = _error_of(s)
                    if err is not None:
                        info["error"] = err[1]
                    else:
                        member = _int(s.get("header") or {}, "member_id")
                        info["leader"] = member != 0 and member == _int(s, "leader")
                        if s.get("errors"):
                            info["error"] = "; ".join(map(str, s["errors"]))
                    if not info["healthy"] and info["error"] is None:
                        info["error"] = f"/health answered {h or r.status_code}"
            except trio.TooSlowError:
                info["healthy"] = False
                info["error"] = f"timed out after {self.request_timeout:g}s"
            except (httpx.HTTPError, ValueError) as e:
                info["healthy"] = False
                info["error"] = _transport_reason(e)
            results[i] = info

        async with trio.open_nursery() as nursery:
            for i, ep in enumerate(self.endpoints):
                nursery.start_soon(probe, i, ep)
        return results


class Watch:
    """A running etcd watch: an async context manager that is also an async iterator of
    ``list[WatchEvent]``. Entering it creates the watch on the first endpoint that accepts it.

    A member that dies closes the HTTP stream; a member that is frozen or partitioned
    keeps it open and silent, so while waiting for events the watch checks its member
    every ``liveness_interval`` seconds (default: the client's request timeout) with a
    status request that carries hasleader, and gives up with EtcdUnavailable when that
    check fails."""

    def __init__(self, client: EtcdClient, prefix, start_revision: int,
                 liveness_interval: float | None):
        self._client = client
        self._body = {"create_request": {**_range_fields(prefix, True),
                                         "start_revision": str(int(start_revision))}}
        self._liveness = liveness_interval or client.request_timeout
        self._index: int | None = None
        self._cm = None
        self._nursery: trio.Nursery | None = None
        self._recv: trio.MemoryReceiveChannel | None = None
        self._done: BaseException | None = None
        self.revision = 0          # header revision of the latest message (informational)
        # Where a new watch must start to miss nothing and repeat nothing: after the last
        # delivered event's revision. (The header revision cannot serve: a watch catching
        # up reports the store's current revision before sending the older events.)
        self.next_revision = int(start_revision)

    @property
    def endpoint(self) -> str | None:
        return None if self._index is None else _endpoint_name(self._client.endpoints[self._index])

    async def __aenter__(self) -> "Watch":
        self._cm = self._session()
        return await self._cm.__aenter__()

    async def __aexit__(self, *exc):
        cm, self._cm = self._cm, None
        return await cm.__aexit__(*exc)

    @asynccontextmanager
    async def _session(self):
        # The reader task lives in a nursery that stays open until __aexit__. Exceptions
        # are carried out of the nursery by hand so that callers catch EtcdUnavailable
        # itself, not an ExceptionGroup wrapping it.
        client = self._client
        error = None
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                reasons = []
                for _ in range(len(client.endpoints)):
                    index = client._current
                    reason = await self._open(index)
                    if reason is None:
                        break
                    reasons.append(reason)
                    client._failed(index)
                else:
                    raise EtcdUnavailable("etcd unavailable for watch: " + "; ".join(reasons))
                yield self
            except BaseException as e:
                error = e
            finally:
                nursery.cancel_scope.cancel()
                self._nursery = None
                if self._done is None:
                    self._done = EtcdError("watch closed")
        if error is not None:
            raise error

    async def _open(self, index: int) -> str | None:
        """Create the watch on one endpoint; None when created, else why not."""
        client = self._client
        name = _endpoint_name(client.endpoints[index])
        send, recv = trio.open_memory_channel(64)
        reader_scope = trio.CancelScope()
        self._nursery.start_soon(self._reader, index, send, reader_scope)
        first = ("end", f"{name}: timed out after {client.request_timeout:g}s")
        with trio.move_on_after(client.request_timeout):
            try:
                first = await recv.receive()
            except trio.EndOfChannel:
                first = ("end", f"{name}: watch stream closed")
        kind, payload = first
        if kind == "msg":
            err = _error_of(payload)
            if err is None and (payload.get("result") or {}).get("created"):
                self._index, self._recv = index, recv
                self.revision = _header_revision(payload["result"])
                return None
            reader_scope.cancel()
            code, message = err or (None, f"unexpected first watch message {str(payload)[:200]}")
            if _is_unavailable(code, message):
                return f"{name}: {message}"
            raise EtcdError(f"{name}: {message}", code)
        reader_scope.cancel()
        return payload

    async def _reader(self, index: int, send: trio.MemorySendChannel, scope: trio.CancelScope) -> None:
        # Runs in the watch's nursery and never raises: every outcome reaches the consumer
        # through the channel and surfaces from __anext__ as an etcd exception.
        import httpx
        client = self._client
        ep = client.endpoints[index]
        name = _endpoint_name(ep)
        with scope:
            async with send:
                try:
                    async with client._http.stream(
                            "POST", client._url(ep, "/v3/watch"), json=self._body,
                            # No read timeout: a quiet prefix legitimately sends nothing
                            # for hours; liveness is checked separately.
                            timeout=httpx.Timeout(client.request_timeout, read=None)) as response:
                        if response.status_code != 200:
                            body = (await response.aread()).decode("utf-8", "replace")
                            try:
                                await send.send(("msg", json.loads(body)))
                            except ValueError:
                                await send.send(("end", f"{name}: watch answered HTTP {response.status_code}"))
                            return
                        async for line in response.aiter_lines():
                            if line.strip():
                                await send.send(("msg", json.loads(line)))
                    await send.send(("end", f"{name}: watch stream closed by the member"))
                except httpx.TimeoutException:
                    await send.send(("end", f"{name}: timed out after {client.request_timeout:g}s"))
                except httpx.HTTPError as e:
                    await send.send(("end", f"{name}: watch stream broke: {_transport_reason(e)}"))
                except ValueError as e:
                    await send.send(("end", f"{name}: bad watch message: {e}"))
                except trio.BrokenResourceError:
                    pass

    def __aiter__(self) -> "Watch":
        if self._recv is None and self._done is None:
            raise RuntimeError("open the watch first: `async with client.watch(...) as w: async for events in w`")
        return self

    async def _check_member(self) -> None:
        ep = self._client.endpoints[self._index]
        status, payload = await self._client._post_once(ep, "/v3/maintenance/status", {})
        if status == "down":
            self._fail(f"watch member stopped answering: {payload}")
        # An error answer still proves the member is alive and has a leader.

    def _fail(self, reason: str) -> None:
        self._client._failed(self._index)
        self._done = EtcdUnavailable(reason)
        raise self._done

    async def __anext__(self) -> list[WatchEvent]:
        if self._done is not None:
            raise self._done
        if self._recv is None:
            raise RuntimeError("open the watch first: `async with client.watch(...) as w`")
        while True:
            item = None
            with trio.move_on_after(self._liveness):
                try:
                    item = await self._recv.receive()
                except trio.EndOfChannel:
                    item = ("end", f"{self.endpoint}: watch stream closed")
            if item is None:
                await self._check_member()
                continue
            kind, payload = item
            if kind == "end":
                self._fail(payload)
            err = _error_of(payload)
            if err is not None:
                code, message = err
                if _is_unavailable(code, message):
                    self._fail(f"{self.endpoint}: {message}")
                self._done = EtcdError(f"{self.endpoint}: {message}", code)
                raise self._done
            result = payload.get("result") or {}
            rev = _header_revision(result)
            if rev:
                self.revision = rev
            if result.get("canceled"):
                compact = _int(result, "compact_revision")
                if compact:
                    self._done = WatchCompacted(
                        f"{self.endpoint}: watch start revision compacted; oldest kept is {compact}",
                        compact)
                else:
                    reason = result.get("cancel_reason") or "watch canceled by etcd"
                    if _is_unavailable(None, reason):
                        self._fail(f"{self.endpoint}: {reason}")
                    self._done = EtcdError(f"{self.endpoint}: {reason}")
                raise self._done
            events = result.get("events") or ()
            if not events:
                continue     # progress notification: nothing changed under the prefix
            batch = [WatchEvent(type=e.get("type") or "PUT", kv=KeyValue.from_json(e.get("kv") or {}))
                     for e in events]
            self.next_revision = batch[-1].kv.mod_revision + 1
            return batch
