"""How broker-to-broker (and admin CLI) connections authenticate: the client side of the
inter-broker listener's security protocol.

Kafka configures it with ``security.inter.broker.protocol`` (here: the inter-broker
listener's protocol), the ``ssl.truststore``/``ssl.keystore`` options for TLS, and
``sasl.mechanism.inter.broker.protocol`` plus the listener's JAAS login (a username and
password) for SASL. :class:`ClientSecurity` holds those; the SASL client exchange is
sans-IO (:meth:`ClientSecurity.sasl_client`), PeerConnection carries its tokens in
SaslHandshake v1 / SaslAuthenticate requests.
"""
from __future__ import annotations

import ssl
from dataclasses import dataclass

# scramp (with asn1crypto: ~15 ms warm, ~40 ms from a cold page cache) is imported by the
# SCRAM client that uses it: every broker imports this module, few speak SCRAM to a peer.

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class SaslClientError(Exception):
    pass


@dataclass(frozen=True)
class ClientSecurity:
    protocol: str = "PLAINTEXT"              # PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    ssl_context: ssl.SSLContext | None = None
    server_hostname_check: bool = True
    sasl_mechanism: str = ""
    sasl_username: str = ""
    sasl_password: str = ""

    @property
    def uses_tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def sasl_client(self) -> "SaslClient":
        return SaslClient(self.sasl_mechanism, self.sasl_username, self.sasl_password)


PLAINTEXT = ClientSecurity()


def client_ssl_context(cafile: str | None, certfile: str | None = None, keyfile: str | None = None,
                       key_password: str | None = None) -> ssl.SSLContext:
    """Verify the peer against ``cafile`` (the system store when None), TLS 1.2+, and present
    a client certificate when one is given (for brokers that require mTLS)."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile or None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if certfile:
        ctx.load_cert_chain(certfile, keyfile or None, password=key_password or None)
    return ctx


class SaslClient:
    """The client half of PLAIN / SCRAM: ``first()`` then ``step(server token)`` until
    ``done``."""

    def __init__(self, mechanism: str, username: str, password: str):
        if mechanism not in SASL_MECHANISMS:
            raise SaslClientError(f"unsupported SASL mechanism {mechanism!r}")
        self.mechanism = mechanism
        self.username = username
        self.password = password
        self.done = False
        self._scram = None
        if mechanism != "PLAIN":
            import scramp
            self._scram = scramp.ScramClient([mechanism], username, password)
        self._steps = 0

    def first(self) -> bytes:
        if self._scram is None:
            return b"\0" + self.username.encode() + b"\0" + self.password.encode()
        return self._scram.get_client_first().encode()

    def step(self, server_token: bytes) -> bytes | None:
        """The next client token, or None when the exchange is complete."""
        self._steps += 1
        if self._scram is None:
            self.done = True
            return None
        import scramp
        try:
            if self._steps == 1:
                self._scram.set_server_first(server_token.decode())
                return self._scram.get_client_final().encode()
            self._scram.set_server_final(server_token.decode())
        except (scramp.ScramException, UnicodeDecodeError) as e:
            raise SaslClientError(f"SCRAM exchange failed: {e}") from None
        self.done = True
        return None
