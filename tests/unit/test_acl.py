"""The sans-IO authorizer (broker/security/acl.py) against Kafka's StandardAuthorizer rules."""
from __future__ import annotations

import pytest

from broker.security.acl import (AclBinding, AclFilter, Authorizer, InvalidAcl, Operation as Op, PatternType as P,
                                 Permission, ResourceType as R, all_operations, decode_acls, encode_acls,
                                 parse_super_users)

ALICE, BOB = "User:CN=alice,O=Example", "User:CN=bob,O=Example"
HOST = "127.0.0.1"


def acl(rt, name, principal, op, perm=Permission.ALLOW, pattern=P.LITERAL, host="*"):
    return AclBinding.make(rt, name, pattern, principal, host, op, perm)


def test_no_acl_found_follows_allow_everyone_if_no_acl_found():
    assert not Authorizer().authorize(ALICE, HOST, Op.READ, R.TOPIC, "t")
    assert Authorizer(allow_if_no_acl=True).authorize(ALICE, HOST, Op.READ, R.TOPIC, "t")
    # An ACL on the resource for someone else: no longer "no ACL found".
    a = Authorizer(allow_if_no_acl=True, acls=[acl(R.TOPIC, "t", BOB, Op.READ)])
    assert not a.authorize(ALICE, HOST, Op.READ, R.TOPIC, "t")
    assert a.authorize(ALICE, HOST, Op.READ, R.TOPIC, "other")


def test_prefixed_write_allows_write_and_describe_only_under_the_prefix():
    a = Authorizer(acls=[acl(R.TOPIC, "orders-", ALICE, Op.WRITE, pattern=P.PREFIXED)])
    assert a.authorize(ALICE, HOST, Op.WRITE, R.TOPIC, "orders-eu")
    assert a.authorize(ALICE, HOST, Op.DESCRIBE, R.TOPIC, "orders-eu")   # WRITE implies DESCRIBE
    assert not a.authorize(ALICE, HOST, Op.READ, R.TOPIC, "orders-eu")
    assert not a.authorize(ALICE, HOST, Op.WRITE, R.TOPIC, "payments")
    assert not a.authorize(ALICE, HOST, Op.WRITE, R.TOPIC, "orders")     # shorter than the prefix
    assert not a.authorize(BOB, HOST, Op.WRITE, R.TOPIC, "orders-eu")
    assert not a.authorize(ALICE, HOST, Op.WRITE, R.GROUP, "orders-eu")  # another resource type


@pytest.mark.parametrize("granted,asked,allowed", [
    (Op.READ, Op.DESCRIBE, True), (Op.WRITE, Op.DESCRIBE, True), (Op.DELETE, Op.DESCRIBE, True),
    (Op.ALTER, Op.DESCRIBE, True), (Op.ALTER_CONFIGS, Op.DESCRIBE_CONFIGS, True),
    (Op.CREATE, Op.DESCRIBE, False), (Op.DESCRIBE, Op.READ, False), (Op.ALTER, Op.DESCRIBE_CONFIGS, False),
    (Op.ALL, Op.DELETE, True), (Op.ALL, Op.ALTER_CONFIGS, True),
])
def test_implied_operations(granted, asked, allowed):
    a = Authorizer(acls=[acl(R.TOPIC, "t", ALICE, granted)])
    assert a.authorize(ALICE, HOST, asked, R.TOPIC, "t") is allowed


def test_deny_wins_and_implies_nothing():
    a = Authorizer(acls=[acl(R.TOPIC, "*", ALICE, Op.ALL),
                         acl(R.TOPIC, "secret", ALICE, Op.READ, Permission.DENY)])
    assert not a.authorize(ALICE, HOST, Op.READ, R.TOPIC, "secret")
    assert a.authorize(ALICE, HOST, Op.DESCRIBE, R.TOPIC, "secret")   # DENY READ does not deny DESCRIBE
    assert a.authorize(ALICE, HOST, Op.READ, R.TOPIC, "public")
    a = Authorizer(acls=[acl(R.TOPIC, "t", ALICE, Op.READ),
                         acl(R.TOPIC, "t", "User:*", Op.ALL, Permission.DENY, host="10.0.0.1")])
    assert a.authorize(ALICE, HOST, Op.READ, R.TOPIC, "t")
    assert not a.authorize(ALICE, "10.0.0.1", Op.READ, R.TOPIC, "t")
    # a prefixed DENY beats a literal ALLOW
    a = Authorizer(acls=[acl(R.TOPIC, "t1", ALICE, Op.WRITE),
                         acl(R.TOPIC, "t", ALICE, Op.WRITE, Permission.DENY, pattern=P.PREFIXED)])
    assert not a.authorize(ALICE, HOST, Op.WRITE, R.TOPIC, "t1")


def test_wildcards_for_principal_host_and_resource():
    a = Authorizer(acls=[acl(R.GROUP, "*", "User:*", Op.READ, host=HOST)])
    assert a.authorize(ALICE, HOST, Op.READ, R.GROUP, "any-group")
    assert a.authorize(BOB, HOST, Op.DESCRIBE, R.GROUP, "g")
    assert not a.authorize(BOB, "10.1.1.1", Op.READ, R.GROUP, "g")


def test_super_users_bypass_everything():
    users = parse_super_users(" User:CN=admin,O=Example ; User:ANONYMOUS;")
    assert users == {"User:CN=admin,O=Example", "User:ANONYMOUS"}
    a = Authorizer(users, acls=[acl(R.TOPIC, "*", "User:*", Op.ALL, Permission.DENY)])
    assert a.authorize("User:CN=admin,O=Example", HOST, Op.DELETE, R.TOPIC, "t")
    assert a.authorize("User:ANONYMOUS", HOST, Op.CLUSTER_ACTION, R.CLUSTER, "kafka-cluster")
    assert not a.authorize(ALICE, HOST, Op.READ, R.TOPIC, "t")
    assert a.authorized_operations("User:ANONYMOUS", HOST, R.TOPIC, "t") == all_operations(R.TOPIC)


def test_authorized_operations_bit_sets():
    a = Authorizer(acls=[acl(R.TOPIC, "t", ALICE, Op.READ), acl(R.CLUSTER, "kafka-cluster", ALICE, Op.DESCRIBE)])
    assert a.authorized_operations(ALICE, HOST, R.TOPIC, "t") == (1 << Op.READ) | (1 << Op.DESCRIBE)
    assert a.authorized_operations(ALICE, HOST, R.CLUSTER, "kafka-cluster") == 1 << Op.DESCRIBE
    assert a.authorized_operations(BOB, HOST, R.TOPIC, "t") == 0
    # Kafka's numbers: a topic supports READ..ALTER_CONFIGS except CLUSTER_ACTION and IDEMPOTENT_WRITE
    assert all_operations(R.TOPIC) == sum(1 << o for o in (3, 4, 5, 6, 7, 8, 10, 11))
    assert all_operations(R.GROUP) == sum(1 << o for o in (3, 6, 8))


def test_authorize_any_topic_for_idempotent_producers():
    a = Authorizer(acls=[acl(R.TOPIC, "logs-", ALICE, Op.WRITE, pattern=P.PREFIXED)])
    assert a.authorize_any(ALICE, HOST, Op.WRITE, R.TOPIC)
    assert not a.authorize_any(BOB, HOST, Op.WRITE, R.TOPIC)
    a = Authorizer(acls=[acl(R.TOPIC, "logs-", ALICE, Op.WRITE, pattern=P.PREFIXED),
                         acl(R.TOPIC, "logs", ALICE, Op.WRITE, Permission.DENY, pattern=P.PREFIXED)])
    assert not a.authorize_any(ALICE, HOST, Op.WRITE, R.TOPIC)
    a = Authorizer(acls=[acl(R.TOPIC, "a", ALICE, Op.WRITE), acl(R.TOPIC, "*", ALICE, Op.WRITE, Permission.DENY)])
    assert not a.authorize_any(ALICE, HOST, Op.WRITE, R.TOPIC)


@pytest.mark.parametrize("args", [
    (R.ANY, "t", P.LITERAL, ALICE, "*", Op.READ, Permission.ALLOW),
    (R.TOPIC, "t", P.MATCH, ALICE, "*", Op.READ, Permission.ALLOW),
    (R.TOPIC, "t", P.LITERAL, ALICE, "*", Op.ANY, Permission.ALLOW),
    (R.TOPIC, "t", P.LITERAL, ALICE, "*", Op.READ, Permission.ANY),
    (R.TOPIC, "", P.LITERAL, ALICE, "*", Op.READ, Permission.ALLOW),
    (R.TOPIC, "t", P.LITERAL, "alice", "*", Op.READ, Permission.ALLOW),
    (R.CLUSTER, "my-cluster", P.LITERAL, ALICE, "*", Op.ALTER, Permission.ALLOW),
    (R.TOPIC, "*", P.PREFIXED, ALICE, "*", Op.READ, Permission.ALLOW),
    (99, "t", P.LITERAL, ALICE, "*", Op.READ, Permission.ALLOW),
])
def test_invalid_bindings_are_refused(args):
    with pytest.raises(InvalidAcl):
        AclBinding.make(*args)


def test_filters_any_and_match():
    lit = acl(R.TOPIC, "orders", ALICE, Op.READ)
    star = acl(R.TOPIC, "*", BOB, Op.READ)
    pre = acl(R.TOPIC, "ord", ALICE, Op.WRITE, Permission.DENY, pattern=P.PREFIXED)
    grp = acl(R.GROUP, "orders", ALICE, Op.READ)
    every = [lit, star, pre, grp]

    def sel(*args):
        f = AclFilter.make(*args)
        return {b for b in every if f.matches(b)}
    assert sel(R.ANY, None, P.ANY, None, None, Op.ANY, Permission.ANY) == set(every)
    assert sel(R.TOPIC, "orders", P.ANY, None, None, Op.ANY, Permission.ANY) == {lit}
    assert sel(R.TOPIC, "orders", P.MATCH, None, None, Op.ANY, Permission.ANY) == {lit, star, pre}
    assert sel(R.TOPIC, "ord", P.PREFIXED, None, None, Op.ANY, Permission.ANY) == {pre}
    assert sel(R.TOPIC, None, P.LITERAL, None, None, Op.ANY, Permission.ANY) == {lit, star}
    assert sel(R.ANY, None, P.ANY, ALICE, None, Op.ANY, Permission.DENY) == {pre}
    assert sel(R.ANY, None, P.ANY, None, "*", Op.READ, Permission.ANY) == {lit, star, grp}
    with pytest.raises(InvalidAcl):
        AclFilter.make(R.UNKNOWN, None, P.ANY, None, None, Op.ANY, Permission.ANY)
    with pytest.raises(InvalidAcl):
        AclFilter.make(R.ANY, None, 42, None, None, Op.ANY, Permission.ANY)


def test_durable_form_round_trips():
    acls = {acl(R.TOPIC, "a/b", ALICE, Op.READ), acl(R.TRANSACTIONAL_ID, "tx-", BOB, Op.WRITE, pattern=P.PREFIXED),
            acl(R.CLUSTER, "kafka-cluster", ALICE, Op.ALTER, Permission.DENY, host=HOST)}
    assert set(decode_acls(encode_acls(acls))) == acls
    assert encode_acls(acls) == encode_acls(list(reversed(sorted(acls, key=AclBinding.key))))


def test_cluster_image_applies_acl_keys():
    from broker.security.acl_store import acl_etcd_key
    from controller.image import ClusterImage, encode
    image = ClusterImage()
    b = acl(R.GROUP, "a/b%c", ALICE, Op.READ)
    key = acl_etcd_key(b)
    assert key.startswith("/canopy/acls/GROUP/LITERAL/a%2Fb%25c/")
    gen = image.acl_generation
    assert image.apply(key, encode(b.to_json()), 5, 5) == ""
    assert image.acl_generation != gen and [AclBinding.from_json(v) for v in image.acls.values()] == [b]
    image.apply(key, None, 6, 0)
    assert image.acls == {}
    assert image.apply("/canopy/acls/x", b"null") is None and image.unreadable == ["/canopy/acls/x"]


def test_authorizer_option():
    from broker.config import ConfigError, load_config
    base = {"data_dir": "/tmp/unused"}
    assert load_config(base, {}).authorizer == ""
    for name in ("standard", "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                 "kafka.security.authorizer.AclAuthorizer"):
        assert load_config({**base, "authorizer": name}, {}).authorizer == "standard"
    c = load_config(base, {"CANOPY_AUTHORIZER": "standard", "CANOPY_SUPER_USERS": "User:CN=a,O=b;User:ANONYMOUS",
                           "CANOPY_ALLOW_EVERYONE_IF_NO_ACL_FOUND": "true"})
    assert (c.authorizer, parse_super_users(c.super_users), c.allow_everyone_if_no_acl_found) == \
        ("standard", {"User:CN=a,O=b", "User:ANONYMOUS"}, True)
    with pytest.raises(ConfigError, match="authorizer must be"):
        load_config({**base, "authorizer": "ranger"}, {})
