"""TLS listeners (security protocol SSL) with trio.SSLStream.

The server context: the broker's certificate chain and key from a PEM keystore (Kafka's
``ssl.keystore.type=PEM``), TLS 1.2 or newer with the ssl module's default ciphers (forward
secret AEAD suites only under the system OpenSSL policy), and client authentication as
Kafka's ``ssl.client.auth``: ``none``, ``requested`` (a certificate is verified if sent) or
``required`` (mTLS: no certificate, no connection). A verified client certificate makes the
connection's principal ``User:<subject DN>`` in RFC 2253 form, as Kafka's default
``ssl.principal.mapping.rules`` (DEFAULT) gives it; without one it is ``User:ANONYMOUS``.

Zero-copy sendfile cannot apply inside TLS (the kernel would send the records unencrypted),
so a TLS connection reads record bytes from the segment files (pread) and encrypts them; the
plaintext path in broker/server.py keeps sendfile.
"""
from __future__ import annotations

import logging
import ssl

import trio

from protocol.schema import ExternalBytes

from .. import cold_reads

log = logging.getLogger("canopy.security")

CLIENT_AUTH = ("none", "requested", "required")
_VERIFY_MODE = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
# A client that opens a TCP connection and never finishes its handshake must not hold a
# task forever (Kafka bounds it with connections.max.idle.ms; a handshake is far quicker).
HANDSHAKE_TIMEOUT_S = 10.0
# Record bytes read from a segment per TLS write: large enough for full TLS records
# (16 KiB each), small enough not to hold a whole multi-MiB fetch in memory twice.
EXTERNAL_CHUNK = 1 << 20

ANONYMOUS = "User:ANONYMOUS"


class TLSConfigError(ValueError):
    """A keystore/truststore that cannot be loaded, or inconsistent TLS options."""


def server_context(keystore: str, key_password: str | None, truststore: str | None,
                   client_auth: str) -> ssl.SSLContext:
    """The SSLContext every SSL listener of this broker serves with."""
    if client_auth not in CLIENT_AUTH:
        raise TLSConfigError(f"ssl-client-auth must be one of {', '.join(CLIENT_AUTH)}, got {client_auth!r}")
    if not keystore:
        raise TLSConfigError("an SSL listener needs ssl-keystore-location (PEM: certificate chain and private key)")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    # No TLS 1.2 renegotiation: a cancelled receive during one would break the stream
    # (trio.SSLStream), and Kafka clients never renegotiate.
    ctx.options |= getattr(ssl, "OP_NO_RENEGOTIATION", 0)
    try:
        ctx.load_cert_chain(keystore, password=key_password or None)
    except FileNotFoundError:
        raise TLSConfigError(f"ssl-keystore-location {keystore}: no such file") from None
    except (ssl.SSLError, OSError) as e:
        raise TLSConfigError(f"ssl-keystore-location {keystore}: not a PEM certificate chain with its "
                             f"private key ({e.strerror or e})") from None
    if client_auth != "none" and not truststore:
        raise TLSConfigError(f"ssl-client-auth={client_auth} needs ssl-truststore-location (PEM CA certificates) "
                             "to verify client certificates")
    if truststore:
        try:
            ctx.load_verify_locations(cafile=truststore)
        except FileNotFoundError:
            raise TLSConfigError(f"ssl-truststore-location {truststore}: no such file") from None
        except (ssl.SSLError, OSError) as e:
            raise TLSConfigError(f"ssl-truststore-location {truststore}: not PEM CA certificates "
                                 f"({e.strerror or e})") from None
    ctx.verify_mode = _VERIFY_MODE[client_auth]
    return ctx


# Attribute names as RFC 2253 (and Java's X500Principal.getName()) writes them.
_RDN_NAMES = {
    "commonName": "CN", "countryName": "C", "localityName": "L", "stateOrProvinceName": "ST",
    "organizationName": "O", "organizationalUnitName": "OU", "streetAddress": "STREET",
    "domainComponent": "DC", "userId": "UID",
}


def _escape(value: str) -> str:
    out = []
    for i, ch in enumerate(value):
        if ch in ',+"\\<>;' or (i == 0 and ch in "# ") or (i == len(value) - 1 and ch == " "):
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def subject_dn(peercert: dict) -> str:
    """RFC 2253 subject DN of a certificate as ``ssl.getpeercert()`` decodes it: the most
    specific RDN first (the certificate stores them the other way round), multi-valued
    RDNs joined with '+'. Attributes without an RFC 2253 name keep the ssl module's name."""
    rdns = []
    for rdn in reversed(peercert.get("subject", ())):
        rdns.append("+".join(f"{_RDN_NAMES.get(k, k)}={_escape(v)}" for k, v in rdn))
    return ",".join(rdns)


def principal_of(ssl_object) -> str:
    cert = ssl_object.getpeercert()
    return f"User:{subject_dn(cert)}" if cert else ANONYMOUS


def tls_connection_class(base, context: ssl.SSLContext):
    """A connection class for SSL listeners: ``base`` (broker/server.py Connection) with its
    byte I/O going through a TLS stream. Built here so server.py keeps only the plaintext,
    zero-copy path."""

    class TLSConnection(base):
        security_protocol = "SSL"

        def __init__(self, broker, stream, listener):
            super().__init__(broker, stream, listener)
            self.tls = trio.SSLStream(stream, context, server_side=True)
            self.principal = ANONYMOUS
            self._pending = b""
            self._eof = False

        async def run(self) -> None:
            try:
                with trio.fail_after(HANDSHAKE_TIMEOUT_S):
                    await self.tls.do_handshake()
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, OSError) as e:
                cause = e.__cause__ or e
                # One line per refused client (untrusted certificate, no certificate under
                # ssl.client.auth=required, plaintext bytes on a TLS port, ...); the others
                # are not affected. A peer that closes without a word (a TCP health check,
                # a port probe) is not a refusal: debug only.
                quiet = isinstance(cause, ssl.SSLEOFError) or getattr(cause, "reason", None) == \
                    "UNEXPECTED_EOF_WHILE_READING"
                (log.debug if quiet else log.warning)("closing connection %s from %s on listener %s: TLS handshake failed: %s",
                            self.id, self.peer, self.listener,
                            "timed out" if isinstance(e, trio.TooSlowError) else _reason(cause))
                with trio.CancelScope(shield=True):
                    await self.stream.aclose()
                return
            self.principal = principal_of(self.tls)
            log.debug("connection %s from %s on listener %s: TLS %s, principal %s", self.id, self.peer,
                      self.listener, self.tls.version(), self.principal)
            await super().run()

        # SO_RCVLOWAT counts ciphertext in the socket, while part of a frame may already
        # wait decrypted in Python: a low-water mark could then never be reached.
        low_water_enabled = False

        async def wait_readable(self) -> None:
            if self._pending or self._eof:
                return
            data = await self.tls.receive_some(1 << 16)
            if data:
                self._pending = data
            else:
                self._eof = True

        async def recv_into(self, buffer) -> int:
            if not self._pending:
                if self._eof:
                    return 0
                try:
                    data = await self.tls.receive_some(len(buffer))
                except trio.BrokenResourceError as e:
                    raise ConnectionError(_reason(e.__cause__ or e)) from None
                if not data:
                    return 0
                self._pending = data
            n = min(len(buffer), len(self._pending))
            buffer[:n] = self._pending[:n]
            self._pending = self._pending[n:]
            if not self._pending:
                n += self._drain_into(buffer, n)
            return n

        def _drain_into(self, buffer, at: int) -> int:
            """Decrypt what has already arrived straight into ``buffer[at:]``, without
            waiting. SSLStream.receive_some returns one TLS record per call, and librdkafka
            writes one record per buffer slice (about one per message), so a 1 MB Produce
            would otherwise take ~1000 trips through the scheduler (measured: TLS produce
            at 0.22 of plaintext). Only this task reads the stream, so reading the
            SSLObject directly between receive_some calls is safe; anything it wants to
            write (a TLS 1.3 key update) goes out with the next send."""
            sslobj = getattr(self.tls, "_ssl_object", None)
            if sslobj is None:
                return 0
            view = memoryview(buffer)[at:]
            got = 0
            while got < len(view):
                try:
                    k = sslobj.read(len(view) - got, view[got:])
                except ssl.SSLError:
                    break   # nothing decryptable buffered (or an error receive_some will raise)
                if not k:
                    break
                got += k
            return got

        async def send_bytes(self, data: bytes) -> None:
            if not data:
                return
            from broker.server import SEND_TIMEOUT_S, StalledReader
            with trio.move_on_after(SEND_TIMEOUT_S):
                await self.tls.send_all(data)
                return
            raise StalledReader(f"peer read nothing for {SEND_TIMEOUT_S:g} s; {len(data)} bytes of a response unsent")

        async def send_external(self, ext: ExternalBytes) -> None:
            try:
                for fd, position, size in ext.source.regions:
                    while size > 0:
                        # A cold chunk is read by a worker thread (broker/cold_reads.py).
                        chunk = await cold_reads.pread(fd, min(size, EXTERNAL_CHUNK), position)
                        if not chunk:
                            # The file is shorter than the index promised (segment deleted
                            # under us): the frame cannot be completed.
                            raise trio.BrokenResourceError("segment shrank during a TLS fetch")
                        await self.send_bytes(chunk)
                        position += len(chunk)
                        size -= len(chunk)
            finally:
                ext.source.release()

    return TLSConnection


def _reason(e: BaseException) -> str:
    if isinstance(e, ssl.SSLError):
        if e.reason in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "UNKNOWN_PROTOCOL"):
            return f"{e.reason} (not a TLS client: a PLAINTEXT client on an SSL listener?)"
        return e.reason or str(e)
    return str(e) or type(e).__name__
