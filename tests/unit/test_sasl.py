"""The SASL exchange (broker/security/sasl.py) and SCRAM credentials (broker/security/scram.py),
driven deterministically with scramp's client and hand-made tokens."""
import pytest
import scramp

from broker.security import scram
from broker.security.sasl import AuthenticationFailed, SaslServer, SaslStateError, parse_mechanisms
from protocol.errors import ErrorCode

ALL = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@pytest.fixture(scope="module")
def users():
    return {"alice": {"SCRAM-SHA-256": scram.make_credential("SCRAM-SHA-256", "alice-secret", 4096),
                      "SCRAM-SHA-512": scram.make_credential("SCRAM-SHA-512", "alice-secret", 4096)},
            "bob": {"SCRAM-SHA-512": scram.make_credential("SCRAM-SHA-512", "bob,=pw", 4096)},
            "o,d=d": {"SCRAM-SHA-256": scram.make_credential("SCRAM-SHA-256", "pw", 4096)}}


def server(users, enabled=ALL):
    return SaslServer(enabled, lambda u, m: users.get(u, {}).get(m))


def scram_login(srv, mech, user, password, first_extra=""):
    assert srv.handshake(mech, 1)["error_code"] == 0
    client = scramp.ScramClient([mech], user, password)
    first = client.get_client_first() + first_extra
    client.set_server_first(srv.authenticate(first.encode()).decode())
    final = srv.authenticate(client.get_client_final().encode())
    client.set_server_final(final.decode())   # the server proved it knows the key too
    return srv


@pytest.mark.parametrize("mech", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_success_sets_principal(users, mech):
    srv = scram_login(server(users), mech, "alice", "alice-secret")
    assert srv.state == "complete" and srv.principal == "User:alice"


def test_scram_username_with_escaped_characters(users):
    srv = scram_login(server(users), "SCRAM-SHA-256", "o,d=d", "pw")
    assert srv.principal == "User:o,d=d"


@pytest.mark.parametrize("user, password, reason", [("alice", "wrong", "wrong password"),
                                                    ("mallory", "x", "unknown user")])
def test_scram_refusals(users, user, password, reason):
    srv = server(users)
    with pytest.raises(AuthenticationFailed, match="invalid credentials with SASL mechanism SCRAM-SHA-256") as e:
        scram_login(srv, "SCRAM-SHA-256", user, password)
    assert e.value.reason == reason and srv.state == "failed" and srv.principal is None


def test_scram_tokenauth_extension_is_refused(users):
    srv = server(users)
    with pytest.raises(AuthenticationFailed, match="delegation tokens"):
        scram_login(srv, "SCRAM-SHA-256", "alice", "alice-secret", first_extra=",tokenauth=true")
    assert srv.state == "failed"


def test_plain_checks_the_password_against_the_scram_credential(users):
    srv = server(users)
    assert srv.handshake("PLAIN", 1)["error_code"] == 0
    assert srv.authenticate(b"\0alice\0alice-secret") == b""
    assert srv.principal == "User:alice"
    srv = server(users)   # only a SHA-512 credential, and a password with , and =
    srv.handshake("PLAIN", 0)
    assert srv.raw_tokens
    srv.authenticate(b"bob\0bob\0bob,=pw")
    assert srv.principal == "User:bob"


@pytest.mark.parametrize("token, reason", [(b"\0alice\0nope", "wrong password"), (b"\0eve\0x", "unknown user"),
                                           (b"alice-secret", "malformed"), (b"\0\0x", "no username")])
def test_plain_refusals(users, token, reason):
    srv = server(users)
    srv.handshake("PLAIN", 1)
    with pytest.raises(AuthenticationFailed, match="invalid credentials with SASL mechanism PLAIN") as e:
        srv.authenticate(token)
    assert reason in e.value.reason and srv.principal is None


def test_plain_other_authzid_is_refused(users):
    srv = server(users)
    srv.handshake("PLAIN", 1)
    with pytest.raises(AuthenticationFailed, match="authorization id"):
        srv.authenticate(b"root\0alice\0alice-secret")


def test_handshake_refuses_disabled_mechanisms_with_the_enabled_list(users):
    srv = server(users, ("SCRAM-SHA-512",))
    resp = srv.handshake("PLAIN", 1)
    assert resp == {"error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM, "mechanisms": ["SCRAM-SHA-512"]}
    assert srv.state == "failed"
    assert server(users).handshake("GSSAPI", 1)["error_code"] == ErrorCode.UNSUPPORTED_SASL_MECHANISM


def test_out_of_order_requests_are_illegal_state(users):
    with pytest.raises(SaslStateError, match="before SaslHandshake"):
        server(users).authenticate(b"\0alice\0alice-secret")
    srv = server(users)
    srv.handshake("PLAIN", 1)
    with pytest.raises(SaslStateError):
        srv.handshake("PLAIN", 1)


def test_parse_mechanisms():
    assert parse_mechanisms(" plain , SCRAM-SHA-512,plain") == ("PLAIN", "SCRAM-SHA-512")
    with pytest.raises(ValueError, match="GSSAPI"):
        parse_mechanisms("GSSAPI")
    with pytest.raises(ValueError, match="no mechanism"):
        parse_mechanisms(" , ")


def test_credential_matches_scramp_and_holds_no_password():
    cred = scram.make_credential("SCRAM-SHA-256", "pw", 4096, salt=b"0123456789abcdef")
    assert scramp.ScramMechanism("SCRAM-SHA-256").make_auth_info("pw", 4096, b"0123456789abcdef") == \
        (cred.salt, cred.stored_key, cred.server_key, 4096)
    assert b"pw" not in scram.encode_user({"SCRAM-SHA-256": cred})
    assert scram.decode_user(scram.encode_user({"SCRAM-SHA-256": cred})) == {"SCRAM-SHA-256": cred}


def _upsert(name, mech=1, iterations=4096, password=b"pw"):
    salt = b"salt-salt-salt"
    mname = scram.MECHANISM_NAMES.get(mech, "SCRAM-SHA-256")
    return {"name": name, "mechanism": mech, "iterations": iterations, "salt": salt,
            "salted_password": scram.salted_password(mname, password, salt, max(iterations, 1))}


def test_alteration_rules_follow_kafka():
    results, users = scram.validate_alteration({}, [], [_upsert("a"), _upsert("b", mech=2)])
    assert results == {"a": (0, None), "b": (0, None)} and set(users) == {"a", "b"}
    assert scram.password_matches("SCRAM-SHA-256", users["a"]["SCRAM-SHA-256"], b"pw")
    results, after = scram.validate_alteration(users, [{"name": "a", "mechanism": 1}, {"name": "zz", "mechanism": 1}],
                                               [_upsert("c", mech=3), _upsert("d", iterations=4095),
                                                _upsert("e", iterations=16385), _upsert(""),
                                                _upsert("b"), _upsert("b")])
    assert results["a"] == (0, None)
    assert results["zz"][0] == ErrorCode.RESOURCE_NOT_FOUND
    assert results["c"][0] == ErrorCode.UNSUPPORTED_SASL_MECHANISM
    assert results["d"][0] == results["e"][0] == results[""][0] == ErrorCode.UNACCEPTABLE_CREDENTIAL
    assert results["b"][0] == ErrorCode.DUPLICATE_RESOURCE
    assert set(after) == {"b"}   # a deleted (its only credential), nothing else accepted


def test_describe(users):
    out = scram.describe(users, None)
    assert [r["user"] for r in out] == sorted(users)
    assert out[0]["credential_infos"] == [{"mechanism": 1, "iterations": 4096}, {"mechanism": 2, "iterations": 4096}]
    out = scram.describe(users, ["nobody", "bob", "bob"])
    assert [(r["user"], r["error_code"]) for r in out] == [("nobody", ErrorCode.RESOURCE_NOT_FOUND),
                                                          ("bob", ErrorCode.DUPLICATE_RESOURCE)]


def test_file_store_round_trip(tmp_path):
    users = {"a": {"SCRAM-SHA-512": scram.make_credential("SCRAM-SHA-512", "x", 4096)}}
    scram.save_file(tmp_path, users)
    assert scram.load_file(tmp_path) == users
    assert (tmp_path / scram.CREDENTIALS_FILE).stat().st_mode & 0o077 == 0
    (tmp_path / scram.CREDENTIALS_FILE).write_text("{")
    with pytest.raises(ValueError, match="unreadable SCRAM credentials"):
        scram.load_file(tmp_path)


def test_several_mechanisms_of_one_user_in_one_request_are_fine():
    results, users = scram.validate_alteration({}, [], [_upsert("a"), _upsert("a", mech=2)])
    assert results == {"a": (0, None)} and set(users["a"]) == {"SCRAM-SHA-256", "SCRAM-SHA-512"}
    # one bad credential refuses the user's whole change
    results, after = scram.validate_alteration(users, [{"name": "a", "mechanism": 1}], [_upsert("a", 2, 10)])
    assert results["a"][0] == ErrorCode.UNACCEPTABLE_CREDENTIAL and after == users


def _final_with_nonce(client, srv, make_nonce):
    """A client-final message with the nonce chosen by ``make_nonce(client nonce, full nonce)``,
    proof computed over the message as sent (as librdkafka 2.0 does)."""
    import base64, hashlib, hmac as hm
    first = client.get_client_first()
    c_nonce = first.split("r=", 1)[1]
    server_first = srv.authenticate(first.encode()).decode()
    attrs = dict(a.split("=", 1) for a in server_first.split(","))
    salted = scram.salted_password("SCRAM-SHA-256", b"alice-secret", base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = hm.digest(salted, b"Client Key", "sha256")
    stored = hashlib.sha256(client_key).digest()
    without = f"c=biws,r={make_nonce(c_nonce, attrs['r'])}"
    auth = ",".join((first[3:], server_first, without)).encode()
    sig = hm.digest(stored, auth, "sha256")
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, sig))).decode()
    return srv.authenticate(f"{without},p={proof}".encode())


def test_scram_accepts_librdkafka_2_0_doubled_nonce_but_no_other(users):
    srv = server(users)
    srv.handshake("SCRAM-SHA-256", 1)
    reply = _final_with_nonce(scramp.ScramClient(["SCRAM-SHA-256"], "alice", "x"), srv, lambda c, full: c + full)
    assert reply.startswith(b"v=") and srv.principal == "User:alice"
    srv = server(users)
    srv.handshake("SCRAM-SHA-256", 1)
    with pytest.raises(AuthenticationFailed) as e:
        _final_with_nonce(scramp.ScramClient(["SCRAM-SHA-256"], "alice", "x"), srv, lambda c, full: "evil" + full)
    assert "nonce" in e.value.reason


@pytest.mark.parametrize("mech", ALL)
def test_inter_broker_client_against_the_server(users, mech):
    """replication/client_security.py's SaslClient (what brokers and `canopy users` log in
    with) completes against the server, and fails on a wrong password."""
    from replication.client_security import SaslClient, SaslClientError
    srv = server(users)
    srv.handshake(mech, 1)
    client = SaslClient(mech, "alice", "alice-secret")
    token = client.first()
    while token is not None:
        token = client.step(srv.authenticate(token))
    assert client.done and srv.principal == "User:alice"
    srv = server(users)
    srv.handshake(mech, 1)
    client = SaslClient(mech, "alice", "wrong")
    with pytest.raises(AuthenticationFailed):
        token = client.first()
        while token is not None:
            token = client.step(srv.authenticate(token))
    with pytest.raises(SaslClientError):
        SaslClient("GSSAPI", "a", "b")
