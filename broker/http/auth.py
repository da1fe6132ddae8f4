"""Who may use the HTTP port: no more than may use the Kafka listeners.

* Any PLAINTEXT listener: anyone can read every record over Kafka, so the port is open.
* Every listener SSL or SASL_SSL: HTTPS with the listeners' certificate and
  ``ssl-client-auth`` (app.tls_context).
* Any SASL listener (and none PLAINTEXT): every request carries HTTP Basic credentials of
  a SCRAM user (``canopy users add``), checked as SASL PLAIN checks them, against the
  stored salted keys; the principal is ``User:<name>``. A missing or wrong one is 401 with
  ``WWW-Authenticate: Basic``.
* With an authorizer (``--authorizer standard``) the principal's ACLs apply: the tail of
  a topic needs READ on it, the status page, ``/status.json`` and ``/metrics`` DESCRIBE on
  the cluster (they show every topic and group). A request without credentials is
  ``User:ANONYMOUS``, as a Kafka client on a PLAINTEXT listener (over HTTPS with client
  certificates too: the HTTP server does not expose the certificate's subject).
"""
from __future__ import annotations

import base64
import binascii

import trio

from ..security.sasl import AuthenticationFailed, _Plain


class Refused(Exception):
    def __init__(self, status: int, error: str, message: str, challenge: bool = False):
        super().__init__(message)
        self.status, self.error, self.challenge = status, error, challenge


def needs_credentials(config) -> bool:
    protocols = {x.security_protocol for x in config.listener_config.listeners}
    return "PLAINTEXT" not in protocols and bool(protocols & {"SASL_PLAINTEXT", "SASL_SSL"})


ANONYMOUS = "User:ANONYMOUS"


async def principal_of(broker, headers) -> str:
    """The request's principal (User:ANONYMOUS when the port asks for no credentials);
    Refused when credentials are needed and missing or wrong."""
    if not needs_credentials(broker.config):
        return ANONYMOUS
    auth = dict(headers).get(b"authorization", b"")
    scheme, _, value = auth.partition(b" ")
    if scheme.lower() != b"basic":
        raise Refused(401, "SASL_AUTHENTICATION_FAILED", "credentials needed: HTTP Basic with a SCRAM user",
                      challenge=True)
    try:
        user, sep, password = base64.b64decode(value.strip(), validate=True).partition(b":")
    except (binascii.Error, ValueError):
        user, sep, password = b"", b"", b""
    if not sep or not user:
        raise Refused(401, "SASL_AUTHENTICATION_FAILED", "malformed HTTP Basic credentials", challenge=True)
    plain = _Plain(broker.credentials.lookup)
    try:
        # PBKDF2 over the password: off the event loop, as the SASL listeners do.
        await trio.to_thread.run_sync(plain.step, b"\0" + user + b"\0" + password)
    except AuthenticationFailed as e:
        raise Refused(401, "SASL_AUTHENTICATION_FAILED", str(e), challenge=True) from None
    return f"User:{plain.username}"


def authorize(broker, principal: str, host: str, operation, resource_type, name: str) -> None:
    acls = broker.acls
    if acls.enabled and not acls.current().authorize(principal, host, operation, resource_type, name):
        raise Refused(403, f"{resource_type.name}_AUTHORIZATION_FAILED",
                      f"{principal} may not {operation.name} {resource_type.name} {name!r}")
