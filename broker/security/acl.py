"""ACLs with the semantics of Kafka's StandardAuthorizer. Sans-IO: bindings in, decisions out.

An ACL binding is a resource pattern (type, name, LITERAL or PREFIXED) plus an entry
(principal, host, operation, ALLOW or DENY). A request by ``principal`` from ``host`` to
perform ``operation`` on a resource is decided as Kafka decides it:

1. a super user (``super.users``) may do everything;
2. the ACLs that apply are those whose pattern covers the resource: LITERAL with the same
   name or the wildcard ``*``, PREFIXED with a name the resource's starts with;
3. of those, an entry matches when its principal is the requester's or ``User:*``, its host
   the requester's or ``*``, and its operation the requested one or ALL;
4. a matching DENY refuses, whatever else allows; a matching ALLOW allows, and an ALLOW of
   READ, WRITE, DELETE or ALTER also allows DESCRIBE, an ALLOW of ALTER_CONFIGS also
   DESCRIBE_CONFIGS (a DENY implies nothing);
5. when no ACL at all applies to the resource (for any principal), the answer is
   ``allow.everyone.if.no.acl.found`` (false by default); otherwise it is a refusal.

Filters (DescribeAcls, DeleteAcls) match bindings as Kafka's AclBindingFilter does: ANY
matches every value, a null name/principal/host matches any, and the pattern type MATCH
selects every pattern that would apply to the named resource (LITERAL same name or ``*``,
PREFIXED a prefix of it).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from enum import IntEnum


class ResourceType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class Permission(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"
CLUSTER_NAME = "kafka-cluster"   # Kafka's one CLUSTER resource

# The operations each resource type has (Kafka's AclEntry.supportedOperations): what
# authorized_operations bit sets are made of.
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[Operation, ...]] = {
    ResourceType.TOPIC: (Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DESCRIBE, Operation.DELETE,
                         Operation.ALTER, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS),
    ResourceType.GROUP: (Operation.READ, Operation.DESCRIBE, Operation.DELETE),
    ResourceType.CLUSTER: (Operation.CREATE, Operation.CLUSTER_ACTION, Operation.DESCRIBE_CONFIGS,
                           Operation.ALTER_CONFIGS, Operation.IDEMPOTENT_WRITE, Operation.ALTER, Operation.DESCRIBE),
    ResourceType.TRANSACTIONAL_ID: (Operation.DESCRIBE, Operation.WRITE),
    ResourceType.DELEGATION_TOKEN: (Operation.DESCRIBE,),
    ResourceType.USER: (Operation.CREATE_TOKENS, Operation.DESCRIBE_TOKENS),
}

# ALLOW on any of these also allows the key (Kafka's implicit DESCRIBE / DESCRIBE_CONFIGS).
_IMPLIED_BY = {
    Operation.DESCRIBE: (Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER),
    Operation.DESCRIBE_CONFIGS: (Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS),
}


class InvalidAcl(ValueError):
    """A binding or filter Kafka would refuse with INVALID_REQUEST."""


def _enum(cls, value: int):
    try:
        return cls(value)
    except ValueError:
        return cls.UNKNOWN   # as Kafka's fromCode: an unknown code is UNKNOWN


@dataclass(frozen=True)
class AclBinding:
    resource_type: ResourceType
    name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    @classmethod
    def make(cls, resource_type: int, name: str, pattern_type: int, principal: str, host: str,
             operation: int, permission: int) -> "AclBinding":
        """A binding from wire values, validated as Kafka validates a CreateAcls entry."""
        b = cls(_enum(ResourceType, resource_type), name, _enum(PatternType, pattern_type), principal, host,
                _enum(Operation, operation), _enum(Permission, permission))
        if b.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
            raise InvalidAcl(f"invalid resource type {resource_type}")
        if b.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise InvalidAcl(f"invalid pattern type {pattern_type}: an ACL is LITERAL or PREFIXED")
        if b.operation in (Operation.UNKNOWN, Operation.ANY):
            raise InvalidAcl(f"invalid operation {operation}")
        if b.permission not in (Permission.ALLOW, Permission.DENY):
            raise InvalidAcl(f"invalid permission type {permission}")
        if not name:
            raise InvalidAcl("the resource name must not be empty")
        if b.resource_type == ResourceType.CLUSTER and name != CLUSTER_NAME:
            raise InvalidAcl(f"the CLUSTER resource is named {CLUSTER_NAME!r}, not {name!r}")
        if b.pattern_type == PatternType.PREFIXED and name == WILDCARD:
            raise InvalidAcl("a PREFIXED pattern cannot be '*' (use LITERAL '*')")
        kind, sep, pname = principal.partition(":")
        if not sep or not kind or not pname:
            raise InvalidAcl(f"principal {principal!r} is not TYPE:NAME (e.g. User:alice)")
        if not host:
            raise InvalidAcl("the host must not be empty (use '*' for any host)")
        return b

    def to_wire(self) -> dict:
        return {"resource_type": int(self.resource_type), "resource_name": self.name,
                "pattern_type": int(self.pattern_type), "principal": self.principal, "host": self.host,
                "operation": int(self.operation), "permission_type": int(self.permission)}

    def to_json(self) -> dict:
        return {"resource_type": self.resource_type.name, "name": self.name, "pattern_type": self.pattern_type.name,
                "principal": self.principal, "host": self.host, "operation": self.operation.name,
                "permission": self.permission.name}

    @classmethod
    def from_json(cls, d: dict) -> "AclBinding":
        return cls.make(ResourceType[d["resource_type"]], d["name"], PatternType[d["pattern_type"]], d["principal"],
                        d["host"], Operation[d["operation"]], Permission[d["permission"]])

    def key(self) -> str:
        """A stable text form, unique per binding (etcd key suffix, file order)."""
        return json.dumps([self.resource_type.name, self.pattern_type.name, self.name, self.principal, self.host,
                           self.operation.name, self.permission.name], separators=(",", ":"))


@dataclass(frozen=True)
class AclFilter:
    resource_type: ResourceType
    name: str | None
    pattern_type: PatternType
    principal: str | None
    host: str | None
    operation: Operation
    permission: Permission

    @classmethod
    def make(cls, resource_type: int, name: str | None, pattern_type: int, principal: str | None,
             host: str | None, operation: int, permission: int) -> "AclFilter":
        f = cls(_enum(ResourceType, resource_type), name, _enum(PatternType, pattern_type), principal, host,
                _enum(Operation, operation), _enum(Permission, permission))
        # Kafka answers INVALID_REQUEST for a filter with an UNKNOWN element.
        for what, v in (("resource type", f.resource_type), ("pattern type", f.pattern_type),
                        ("operation", f.operation), ("permission type", f.permission)):
            if v.name == "UNKNOWN":
                raise InvalidAcl(f"the filter's {what} is unknown")
        return f

    def matches(self, b: AclBinding) -> bool:
        if self.resource_type != ResourceType.ANY and self.resource_type != b.resource_type:
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH) and self.pattern_type != b.pattern_type:
            return False
        if self.name is not None:
            if self.pattern_type == PatternType.MATCH:
                if b.pattern_type == PatternType.LITERAL:
                    if not (b.name == self.name or b.name == WILDCARD):
                        return False
                elif not self.name.startswith(b.name):
                    return False
            elif self.name != b.name:
                return False
        if self.principal is not None and self.principal != b.principal:
            return False
        if self.host is not None and self.host != b.host:
            return False
        if self.operation != Operation.ANY and self.operation != b.operation:
            return False
        if self.permission != Permission.ANY and self.permission != b.permission:
            return False
        return True


def parse_super_users(value: str) -> frozenset[str]:
    """Kafka's ``super.users``: principals separated by ';' (a DN contains commas)."""
    return frozenset(p.strip() for p in value.split(";") if p.strip())


class Authorizer:
    """Decides requests against a set of bindings. Rebuilt (``set_acls``) when they change;
    the index keeps a decision to a few dictionary lookups plus one pass over the
    resource type's PREFIXED patterns."""

    def __init__(self, super_users=(), allow_if_no_acl: bool = False, acls=()):
        self.super_users = frozenset(super_users)
        self.allow_if_no_acl = allow_if_no_acl
        self.set_acls(acls)

    def set_acls(self, acls) -> None:
        self.acls: frozenset[AclBinding] = frozenset(acls)
        literal: dict[tuple[ResourceType, str], list[AclBinding]] = {}
        prefixed: dict[ResourceType, list[AclBinding]] = {}
        for b in self.acls:
            if b.pattern_type == PatternType.LITERAL:
                literal.setdefault((b.resource_type, b.name), []).append(b)
            else:
                prefixed.setdefault(b.resource_type, []).append(b)
        self._literal = literal
        self._prefixed = prefixed

    def _applicable(self, resource_type: ResourceType, name: str) -> list[AclBinding]:
        out = list(self._literal.get((resource_type, name), ()))
        if name != WILDCARD:
            out += self._literal.get((resource_type, WILDCARD), ())
        out += [b for b in self._prefixed.get(resource_type, ()) if name.startswith(b.name)]
        return out

    def authorize(self, principal: str, host: str, operation: Operation, resource_type: ResourceType,
                  name: str) -> bool:
        if principal in self.super_users:
            return True
        return self._decide(self._applicable(resource_type, name), principal, host, operation)

    def _decide(self, applicable: list[AclBinding], principal: str, host: str, operation: Operation) -> bool:
        if not applicable:
            return self.allow_if_no_acl
        allowed = False
        implied = _IMPLIED_BY.get(operation, (operation,))
        for b in applicable:
            if b.principal != principal and b.principal != WILDCARD_PRINCIPAL:
                continue
            if b.host != host and b.host != WILDCARD:
                continue
            if b.permission == Permission.DENY:
                if b.operation == operation or b.operation == Operation.ALL:
                    return False   # DENY wins
            elif b.operation == Operation.ALL or b.operation in implied:
                allowed = True
        return allowed

    def authorized_operations(self, principal: str, host: str, resource_type: ResourceType, name: str) -> int:
        """Kafka's authorized_operations: bit ``1 << operation`` set for each allowed one."""
        ops = SUPPORTED_OPERATIONS[resource_type]
        if principal in self.super_users:
            return all_operations(resource_type)
        applicable = self._applicable(resource_type, name)
        bits = 0
        for op in ops:
            if self._decide(applicable, principal, host, op):
                bits |= 1 << op
        return bits

    def authorize_any(self, principal: str, host: str, operation: Operation, resource_type: ResourceType) -> bool:
        """Kafka's authorizeByResourceType: may the principal perform ``operation`` on at
        least one resource of the type? (InitProducerId for an idempotent producer asks
        for WRITE on any topic.) True when some ALLOW applies that no DENY covers: a DENY
        on LITERAL '*', or a DENY whose pattern contains the ALLOW's."""
        if principal in self.super_users:
            return True

        def matches(b):
            return ((b.principal == principal or b.principal == WILDCARD_PRINCIPAL)
                    and (b.host == host or b.host == WILDCARD)
                    and (b.operation == operation or b.operation == Operation.ALL))
        mine = [b for b in self.acls if b.resource_type == resource_type and matches(b)]
        denies = [b for b in mine if b.permission == Permission.DENY]
        if any(d.pattern_type == PatternType.LITERAL and d.name == WILDCARD for d in denies):
            return False
        for a in mine:
            if a.permission != Permission.ALLOW:
                continue
            covered = any((d.pattern_type == PatternType.LITERAL and a.pattern_type == PatternType.LITERAL
                           and d.name == a.name)
                          or (d.pattern_type == PatternType.PREFIXED and a.name.startswith(d.name))
                          for d in denies)
            if not covered:
                return True
        if self.allow_if_no_acl and not any(b.resource_type == resource_type for b in self.acls):
            return True
        return False


def all_operations(resource_type: ResourceType) -> int:
    """Every operation of the resource type, as a bit set: what Kafka answers when no
    authorizer is configured and the client asks for authorized operations."""
    bits = 0
    for op in SUPPORTED_OPERATIONS[resource_type]:
        bits |= 1 << op
    return bits


def encode_acls(acls) -> str:
    """The durable form (file or etcd value): a JSON list, sorted for stable output."""
    return json.dumps([b.to_json() for b in sorted(acls, key=AclBinding.key)], indent=1)


def decode_acls(text: str | bytes) -> list[AclBinding]:
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError("not a JSON list")
    return [AclBinding.from_json(d) for d in data]
