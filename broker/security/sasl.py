"""SASL on SASL_PLAINTEXT and SASL_SSL listeners: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512.

The exchange as Kafka's SaslServerAuthenticator runs it:

1. The client may send ApiVersions (answered as usual), then SaslHandshake naming a
   mechanism. An unknown or disabled one is answered UNSUPPORTED_SASL_MECHANISM with the
   enabled list, and the connection closes.
2. Handshake v1: the tokens travel inside SaslAuthenticate requests (KIP-152), so a
   failure can carry SASL_AUTHENTICATION_FAILED and a message before the close.
   Handshake v0: the tokens travel as bare length-prefixed frames with no request header
   (the pre-KIP-152 wire format librdkafka and kafka-python still fall back to); a failure
   can only close the connection.
3. Until authentication completes nothing but ApiVersions, SaslHandshake and
   SaslAuthenticate is answered: any other request closes the connection (Kafka throws
   IllegalSaslStateException and disconnects), so no data leaves the broker before then.

PLAIN is ``authzid NUL username NUL password`` (RFC 4616); the password is checked against
the user's SCRAM credential (broker/security/scram.py), so no plaintext password is stored.
SCRAM is RFC 5802 through ``scramp``; Kafka's ``tokenauth`` extension (delegation tokens,
KIP-48) is refused explicitly, since canopy issues no tokens.

:class:`SaslServer` is sans-IO (tokens in, tokens and an outcome out; unit-tested
deterministically); :func:`sasl_connection_class` puts it in front of a connection's
request processing.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import logging
from typing import Callable

import trio

from protocol.errors import ErrorCode
from protocol.framing import parse_request_header
from protocol.messages import ApiKey, api
from protocol.schema import SchemaError

from . import scram as creds
from .tls import ANONYMOUS

log = logging.getLogger("canopy.security")

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
DEFAULT_MECHANISMS = "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"

_HASH = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}

# lookup(user, mechanism) -> the stored credential, or None for an unknown user
Lookup = Callable[[str, str], "creds.ScramCredential | None"]


def parse_mechanisms(text: str) -> tuple[str, ...]:
    """``sasl-enabled-mechanisms``: a comma-separated list (Kafka's sasl.enabled.mechanisms)."""
    out = []
    for m in (p.strip().upper() for p in text.split(",")):
        if not m:
            continue
        if m not in MECHANISMS:
            raise ValueError(f"sasl-enabled-mechanisms: unsupported mechanism {m!r} "
                             f"(supported: {', '.join(MECHANISMS)})")
        if m not in out:
            out.append(m)
    if not out:
        raise ValueError("sasl-enabled-mechanisms: no mechanism given")
    return tuple(out)


class AuthenticationFailed(Exception):
    """The client's credentials were refused. ``str()`` is what the client is told;
    ``reason`` is the broker's log line (it may say more than the client may learn)."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


class SaslStateError(Exception):
    """A SASL request out of order (Kafka's ILLEGAL_SASL_STATE)."""


def _failed(mechanism: str, reason: str) -> AuthenticationFailed:
    # Kafka's wording; it does not tell an unknown user from a wrong password.
    return AuthenticationFailed("Authentication failed during authentication due to invalid credentials "
                                f"with SASL mechanism {mechanism}", reason)


def _unescape_saslname(name: str) -> str:
    # RFC 5802 saslname: ',' and '=' travel as '=2C' and '=3D'.
    return name.replace("=2C", ",").replace("=3D", "=")


class _Plain:
    def __init__(self, lookup: Lookup):
        self.lookup = lookup
        self.username: str | None = None
        self.complete = False

    def step(self, token: bytes) -> bytes:
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise _failed("PLAIN", "malformed PLAIN token (expected authzid NUL username NUL password)")
        try:
            authzid, user, password = parts[0].decode(), parts[1].decode(), parts[2]
        except UnicodeDecodeError:
            raise _failed("PLAIN", "PLAIN username is not UTF-8") from None
        self.username = user
        if not user:
            raise _failed("PLAIN", "no username")
        if authzid and authzid != user:
            # Kafka's PlainSaslServer: an authorization id other than the username is refused.
            raise AuthenticationFailed("Authentication failed: Client requested an authorization id that is "
                                       "different from username", f"authorization id {authzid!r} != username")
        # Any of the user's SCRAM credentials verifies the password (each was derived from it).
        found = [(m, c) for m in ("SCRAM-SHA-256", "SCRAM-SHA-512") if (c := self.lookup(user, m)) is not None]
        if not found:
            raise _failed("PLAIN", "unknown user")
        mech, cred = found[0]
        if not creds.password_matches(mech, cred, password):
            raise _failed("PLAIN", "wrong password")
        self.complete = True
        return b""


class _Scram:
    def __init__(self, mechanism: str, lookup: Lookup):
        self.mechanism = mechanism
        self.lookup = lookup
        self.username: str | None = None
        self.complete = False
        # Imported here, not at the top: scramp pulls in asn1crypto and importlib.metadata
        # (~50 ms of every `canopy serve` start, before any listener is bound), and only a
        # SCRAM exchange needs it.
        import scramp
        self._server = scramp.ScramMechanism(mechanism).make_server(self._auth_info)

    def _auth_info(self, user: str):
        cred = self.lookup(_unescape_saslname(user), self.mechanism)
        if cred is None:
            return None
        return cred.salt, cred.stored_key, cred.server_key, cred.iterations

    def step(self, token: bytes) -> bytes:
        import scramp   # (loaded by __init__: a lookup in sys.modules)
        try:
            text = token.decode()
        except UnicodeDecodeError:
            raise _failed(self.mechanism, "SCRAM message is not UTF-8") from None
        try:
            if self._server.stage is None:
                self._check_client_first(text)
                self._server.set_client_first(text)
                return self._server.get_server_first().encode()
            reply = self._client_final(text)
            self.complete = True
            return reply
        except scramp.ScramException as e:
            reason = str(e.args[0]) if e.args else str(e)
            code = getattr(getattr(e, "server_error", None), "value", None)
            if code == "unknown-user":
                reason = "unknown user"
            raise _failed(self.mechanism, reason) from None

    def _client_final(self, text: str) -> bytes:
        """RFC 5802's client-final check, done here rather than by scramp for one client:
        librdkafka 2.0 (Debian's kcat) echoes the nonce as client nonce + the server's
        whole nonce, i.e. with its own nonce twice. Kafka 3.x accepts that (its SCRAM
        server checks the echoed nonce with endsWith); scramp insists on equality. Only that
        exact form is tolerated besides the correct one; the proof covers the message as
        sent either way, so it does not weaken the password check."""
        srv = self._server
        without_proof, sep, proof_b64 = text.rpartition(",p=")
        attrs = dict(a.split("=", 1) for a in without_proof.split(",") if "=" in a)
        nonce = str(srv.nonce)
        c_nonce = dict(a.split("=", 1) for a in srv.client_first_bare.split(",") if "=" in a).get("r", "")
        if not sep or attrs.get("r") not in (nonce, c_nonce + nonce):
            raise _failed(self.mechanism, "client-final nonce does not match the server's")
        if attrs.get("c") != base64.b64encode(str(srv.gs2_header).encode()).decode():
            raise _failed(self.mechanism, "client-final channel binding does not match its first message")
        try:
            proof = base64.b64decode(proof_b64, validate=True)
        except ValueError:
            raise _failed(self.mechanism, "client proof is not base64") from None
        algo = _HASH[self.mechanism]
        auth_message = ",".join((srv.client_first_bare, srv.server_first, without_proof)).encode()
        client_signature = hmac.digest(srv.stored_key, auth_message, algo)
        if len(proof) != len(client_signature):
            raise _failed(self.mechanism, "client proof has the wrong length")
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature))
        if not hmac.compare_digest(hashlib.new(algo, client_key).digest(), srv.stored_key):
            raise _failed(self.mechanism, "wrong password")
        server_signature = hmac.digest(srv.server_key, auth_message, algo)
        return b"v=" + base64.b64encode(server_signature)

    def _check_client_first(self, text: str) -> None:
        # gs2-header "n,," then attributes n=, r= and any extensions (KIP-84: Kafka clients
        # put tokenauth=true there to log in with a delegation token).
        _, _, bare = text.partition(",")
        _, _, bare = bare.partition(",")
        attrs = dict(a.split("=", 1) for a in bare.split(",") if "=" in a)
        self.username = _unescape_saslname(attrs.get("n", "")) or None
        if attrs.get("tokenauth", "").lower() == "true":
            raise AuthenticationFailed("Authentication failed: delegation tokens (SCRAM extension tokenauth) "
                                       "are not supported by this broker",
                                       "delegation-token SCRAM (tokenauth) refused")


class SaslServer:
    """One connection's SASL state: handshake, then token exchange, then complete.

    Every method is pure: requests' fields in, response fields and the outcome out."""

    def __init__(self, enabled: tuple[str, ...], lookup: Lookup):
        self.enabled = enabled
        self.lookup = lookup
        self.state = "handshake"          # handshake -> authenticate -> complete | failed
        self.mechanism: str | None = None
        self.raw_tokens = False           # handshake v0: bare length-prefixed tokens follow
        self.principal: str | None = None
        self._exchange = None

    @property
    def username(self) -> str | None:
        return getattr(self._exchange, "username", None)

    def handshake(self, mechanism: str, version: int) -> dict:
        """The SaslHandshake response; on error the caller closes after sending it."""
        if self.state != "handshake":
            self.state = "failed"
            raise SaslStateError("SaslHandshake after the handshake")
        if mechanism not in self.enabled:
            self.state = "failed"
            return {"error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM, "mechanisms": list(self.enabled)}
        self.mechanism = mechanism
        self._exchange = _Plain(self.lookup) if mechanism == "PLAIN" else _Scram(mechanism, self.lookup)
        self.state = "authenticate"
        self.raw_tokens = version == 0
        return {"error_code": 0, "mechanisms": list(self.enabled)}

    def authenticate(self, token: bytes) -> bytes:
        """One client token -> the server's token. Raises AuthenticationFailed (the caller
        answers SASL_AUTHENTICATION_FAILED where it can and closes) or SaslStateError."""
        if self.state != "authenticate":
            why = ("SaslAuthenticate before SaslHandshake" if self.state == "handshake"
                   else "SaslAuthenticate after authentication")
            self.state = "failed"
            raise SaslStateError(why)
        try:
            reply = self._exchange.step(token)
        except AuthenticationFailed:
            self.state = "failed"
            raise
        if self._exchange.complete:
            self.state = "complete"
            self.principal = f"User:{self._exchange.username}"
        return reply


def sasl_connection_class(base, enabled: tuple[str, ...], lookup: Lookup, security_protocol: str):
    """A connection class for SASL listeners: ``base`` (the plaintext Connection; the TLS
    class wraps the result for SASL_SSL) answering only the SASL exchange until it
    completes."""

    class SaslConnection(base):
        def __init__(self, broker, stream, listener):
            super().__init__(broker, stream, listener)
            self.principal = ANONYMOUS
            self.sasl = SaslServer(enabled, lookup)

        async def process(self, request) -> bool:
            sasl = self.sasl
            if sasl.state == "complete":
                return await super().process(request)
            if sasl.raw_tokens:
                return await self._raw_token(bytes(request))
            try:
                header, body_at = parse_request_header(request)
            except SchemaError as e:
                log.warning("closing connection %s from %s: malformed request header (%s)", self.id, self.peer, e)
                return False
            key, version = header.api_key, header.api_version
            if key == ApiKey.API_VERSIONS:
                return await super().process(request)
            if key not in (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE):
                a = api(key)
                self._refused(f"ILLEGAL_SASL_STATE: {a.name if a else f'API key {key}'} request before "
                              "SASL authentication")
                return False
            a = api(key)
            lo, hi = a.versions
            if not lo <= version <= hi:
                self._refused(f"unsupported {a.name} version {version}")
                return False
            try:
                body = a.request.decode(request[body_at:], version, exact=False)
            except SchemaError as e:
                self._refused(f"malformed {a.name} v{version} request: {e}")
                return False
            if key == ApiKey.SASL_HANDSHAKE:
                try:
                    resp = sasl.handshake(body["mechanism"], version)
                except SaslStateError as e:
                    await self.send_response(header, key, version,
                                             {"error_code": ErrorCode.ILLEGAL_SASL_STATE, "mechanisms": list(enabled)})
                    self._refused(f"ILLEGAL_SASL_STATE: {e}")
                    return False
                await self.send_response(header, key, version, resp)
                if resp["error_code"]:
                    self._refused(f"UNSUPPORTED_SASL_MECHANISM: client asked for {body['mechanism']!r} "
                                  f"(enabled: {', '.join(enabled)})")
                    return False
                return True
            # SaslAuthenticate (handshake v1)
            try:
                reply = await self._authenticate(bytes(body["auth_bytes"]))
            except SaslStateError as e:
                await self.send_response(header, key, version, {
                    "error_code": ErrorCode.ILLEGAL_SASL_STATE, "error_message": str(e), "auth_bytes": b"",
                    "session_lifetime_ms": 0})
                self._refused(f"ILLEGAL_SASL_STATE: {e}")
                return False
            except AuthenticationFailed as e:
                await self.send_response(header, key, version, {
                    "error_code": ErrorCode.SASL_AUTHENTICATION_FAILED, "error_message": str(e), "auth_bytes": b"",
                    "session_lifetime_ms": 0})
                self._refused(f"SASL_AUTHENTICATION_FAILED ({sasl.mechanism}, user {sasl.username!r}): {e.reason}")
                return False
            # session_lifetime_ms 0: no re-authentication required (KIP-368 is not offered).
            await self.send_response(header, key, version, {
                "error_code": 0, "error_message": None, "auth_bytes": reply, "session_lifetime_ms": 0})
            if sasl.state == "complete":
                self._authenticated()
            return True

        async def _authenticate(self, token: bytes) -> bytes:
            if self.sasl.mechanism == "PLAIN" and self.sasl.state == "authenticate":
                # PLAIN runs PBKDF2 over the password (up to ~20 ms for SCRAM-SHA-512 at
                # 16384 iterations): in a worker thread (hashlib releases the GIL), so a
                # burst of logins does not stall every other connection on the event loop.
                return await trio.to_thread.run_sync(self.sasl.authenticate, token)
            return self.sasl.authenticate(token)

        async def _raw_token(self, token: bytes) -> bool:
            try:
                reply = await self._authenticate(token)
            except AuthenticationFailed as e:
                # Handshake v0 has no way to carry an error: Kafka closes the connection.
                self._refused(f"SASL_AUTHENTICATION_FAILED ({self.sasl.mechanism}, user "
                              f"{self.sasl.username!r}, handshake v0): {e.reason}")
                return False
            await self.send_bytes(len(reply).to_bytes(4, "big") + reply)
            if self.sasl.state == "complete":
                self.sasl.raw_tokens = False
                self._authenticated()
            return True

        def _authenticated(self) -> None:
            self.principal = self.sasl.principal
            log.debug("connection %s from %s on listener %s: SASL %s authenticated %s", self.id, self.peer,
                      self.listener, self.sasl.mechanism, self.principal)

        def _refused(self, why: str) -> None:
            # One line per refused client; the broker keeps serving everyone else.
            log.warning("closing connection %s from %s on listener %s (%s): %s", self.id, self.peer,
                        self.listener, security_protocol, why)

    SaslConnection.security_protocol = security_protocol
    return SaslConnection
