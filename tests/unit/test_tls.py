"""broker/security/tls.py: the server context and the mTLS principal, without sockets."""
from __future__ import annotations

import ssl

import pytest
import trustme

from broker.security.tls import TLSConfigError, server_context, subject_dn


@pytest.fixture
def pems(tmp_path):
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    return tmp_path


def test_tls_1_2_or_newer_and_client_auth_modes(pems):
    for mode, verify in (("none", ssl.CERT_NONE), ("requested", ssl.CERT_OPTIONAL), ("required", ssl.CERT_REQUIRED)):
        ctx = server_context(str(pems / "server.pem"), None, str(pems / "ca.pem"), mode)
        assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
        assert ctx.verify_mode == verify
    with pytest.raises(TLSConfigError, match="needs ssl-truststore-location"):
        server_context(str(pems / "server.pem"), None, None, "requested")
    with pytest.raises(TLSConfigError, match="must be one of"):
        server_context(str(pems / "server.pem"), None, None, "maybe")


def test_subject_dn_is_rfc2253_most_specific_first():
    cert = {"subject": ((("countryName", "DE"),), (("organizationName", "Acme, Inc."),),
                        (("organizationalUnitName", "ops"), ("userId", "42")), (("commonName", " alice "),))}
    assert subject_dn(cert) == "CN=\\ alice\\ ,OU=ops+UID=42,O=Acme\\, Inc.,C=DE"
    assert subject_dn({"subject": ((("commonName", "#1;<x>"),),)}) == "CN=\\#1\\;\\<x\\>"
    assert subject_dn({"subject": ((("emailAddress", "a@b"),),)}) == "emailAddress=a@b"
