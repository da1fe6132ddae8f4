"""`canopy acls add|list|remove` — manage ACLs through any broker (CreateAcls, DescribeAcls,
DeleteAcls v2), like Kafka's kafka-acls.sh.

It is a plain Kafka client speaking PLAINTEXT (replication.client.PeerConnection), so its
principal is User:ANONYMOUS: point it at a PLAINTEXT listener where that principal may
ALTER/DESCRIBE the cluster — in a cluster, the inter-broker listener, whose User:ANONYMOUS
belongs in super-users anyway (docs/security.md, "ACLs"). SSL clients manage ACLs with any
Kafka admin client instead.

- add: one binding per --operation for the resource (--topic/--group/--transactional-id NAME
  or --cluster), --principal, --host (default *), --pattern-type literal|prefixed, --deny.
- list / remove: the same options as a filter; what is not given matches anything (Kafka's
  ANY); --pattern-type also takes match and any (the default). remove prints what it deleted.

Every binding prints as one line: TYPE NAME PATTERN PRINCIPAL HOST OPERATION PERMISSION.
A refusal or a bad option prints one line and exits 2.
"""
from __future__ import annotations

import sys

import trio

from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from replication.client import PeerConnection, PeerError

from .admin_cli import AdminError, _hostport
from .security.acl import CLUSTER_NAME, Operation, PatternType, Permission, ResourceType

VERSION = 2


def add_parser(sub) -> None:
    a = sub.add_parser("acls", help="add, list or remove ACLs (needs --authorizer standard on the broker)")
    asub = a.add_subparsers(dest="acls_command", required=True, parser_class=type(a))
    for name, help_ in (("add", "create ACL bindings"), ("list", "list the bindings a filter matches"),
                        ("remove", "delete the bindings a filter matches")):
        p = asub.add_parser(name, help=help_)
        p.add_argument("--bootstrap", default="127.0.0.1:9092", help="HOST:PORT of a PLAINTEXT listener")
        r = p.add_mutually_exclusive_group(required=name == "add")
        r.add_argument("--topic")
        r.add_argument("--group")
        r.add_argument("--transactional-id", dest="transactional_id")
        r.add_argument("--cluster", action="store_true", help=f"the cluster resource ({CLUSTER_NAME})")
        p.add_argument("--pattern-type", dest="pattern_type",
                       choices=["literal", "prefixed"] if name == "add" else ["literal", "prefixed", "match", "any"],
                       default="literal" if name == "add" else "any")
        p.add_argument("--principal", required=name == "add", help="e.g. User:CN=alice,O=Example or User:*")
        p.add_argument("--host", default="*" if name == "add" else None, help="client IP address or *")
        p.add_argument("--operation", action="append", required=name == "add",
                       choices=[o.name.lower() for o in Operation if o not in (Operation.UNKNOWN, Operation.ANY)])
        if name == "add":
            p.add_argument("--deny", action="store_true", help="a DENY binding (default ALLOW)")
        else:
            p.add_argument("--permission", choices=["allow", "deny"])


def _resource(args) -> tuple[ResourceType, str | None]:
    if args.topic is not None:
        return ResourceType.TOPIC, args.topic
    if args.group is not None:
        return ResourceType.GROUP, args.group
    if args.transactional_id is not None:
        return ResourceType.TRANSACTIONAL_ID, args.transactional_id
    if args.cluster:
        return ResourceType.CLUSTER, CLUSTER_NAME
    return ResourceType.ANY, None


def _line(rt, name, pattern, principal, host, op, perm) -> str:
    return " ".join((ResourceType(rt).name, name, PatternType(pattern).name, principal, host, Operation(op).name,
                     Permission(perm).name))


def _filter(args) -> dict:
    rt, name = _resource(args)
    return {"resource_type_filter": int(rt), "resource_name_filter": name,
            "pattern_type_filter": int(PatternType[args.pattern_type.upper()]),
            "principal_filter": args.principal, "host_filter": args.host,
            "operation": int(Operation[args.operation[0].upper()]) if args.operation else int(Operation.ANY),
            "permission_type": int(Permission[args.permission.upper()]) if args.permission else int(Permission.ANY)}


def _check(code: int, message: str | None) -> None:
    if code:
        name = ErrorCode(code).name if code in ErrorCode._value2member_map_ else f"error {code}"
        raise AdminError(f"refused: {name}" + (f" ({message})" if message else ""))


async def _run(host: str, port: int, args) -> list[str]:
    conn = PeerConnection(host, port, "canopy-acls")
    try:
        if args.acls_command == "add":
            rt, name = _resource(args)
            creations = [{"resource_type": int(rt), "resource_name": name,
                          "resource_pattern_type": int(PatternType[args.pattern_type.upper()]),
                          "principal": args.principal, "host": args.host, "operation": int(Operation[op.upper()]),
                          "permission_type": int(Permission.DENY if args.deny else Permission.ALLOW)}
                         for op in args.operation]
            r = await conn.request(ApiKey.CREATE_ACLS, VERSION, {"creations": creations}, timeout=30)
            for res in r["results"]:
                _check(res["error_code"], res["error_message"])
            return [_line(c["resource_type"], c["resource_name"], c["resource_pattern_type"], c["principal"],
                          c["host"], c["operation"], c["permission_type"]) for c in creations]
        if args.operation and len(args.operation) > 1:
            raise AdminError("list and remove take at most one --operation")
        if args.acls_command == "list":
            r = await conn.request(ApiKey.DESCRIBE_ACLS, VERSION, _filter(args), timeout=30)
            _check(r["error_code"], r["error_message"])
            return sorted(_line(res["resource_type"], res["resource_name"], res["pattern_type"], a["principal"],
                                a["host"], a["operation"], a["permission_type"])
                          for res in r["resources"] for a in res["acls"])
        r = await conn.request(ApiKey.DELETE_ACLS, VERSION, {"filters": [_filter(args)]}, timeout=30)
        [res] = r["filter_results"]
        _check(res["error_code"], res["error_message"])
        return sorted(_line(m["resource_type"], m["resource_name"], m["pattern_type"], m["principal"], m["host"],
                            m["operation"], m["permission_type"]) for m in res["matching_acls"])
    finally:
        await conn.aclose()


def run(args) -> int:
    try:
        host, port = _hostport(args.bootstrap)
        lines = trio.run(_run, host, port, args)
    except (AdminError, PeerError) as e:
        print(f"canopy: {e}", file=sys.stderr)
        return 2
    if lines:
        print("\n".join(lines))
    return 0
