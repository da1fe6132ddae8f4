"""Where a broker's ACLs live, and the authorizer built from them.

* In a cluster (``metadata-store``), one etcd key per binding under ``/canopy/acls/``
  (controller/image.py). Every broker watches ``/canopy/`` and applies the keys to its
  ClusterImage, so an ACL created through any broker applies on every broker as soon as
  the watch delivers it; the broker that wrote it answers only once its own image has it.
* A single broker keeps them in ``acls.json`` in its data directory, replaced durably
  (written, fsynced, renamed) on every change, so they survive a restart or a crash.

``authorizer`` is off (None) unless the ``authorizer`` option names one; handlers then
skip every check (RequestContext.allowed returns True at once).
"""
from __future__ import annotations

import logging
from pathlib import Path
from urllib.parse import quote

from controller.image import ACLS, encode
from storage import replace_durably

from .acl import AclBinding, AclFilter, Authorizer, decode_acls, encode_acls, parse_super_users

log = logging.getLogger("canopy.acl")

ACL_FILE = "acls.json"


def acl_etcd_key(b: AclBinding) -> str:
    parts = (b.resource_type.name, b.pattern_type.name, b.name, b.principal, b.host, b.operation.name,
             b.permission.name)
    return ACLS + "/".join(quote(p, safe="") for p in parts)


class AclStoreError(Exception):
    """The ACLs could not be written (etcd unreachable, disk error): the request's ACLs
    get an error code and nothing is claimed done."""


class AclStore:
    def __init__(self, broker):
        self.broker = broker
        config = broker.config
        self.enabled = bool(config.authorizer)
        self.path = Path(config.data_dir) / ACL_FILE
        self.authorizer: Authorizer | None = None
        self._generation = None
        self._local: set[AclBinding] = set()
        if self.enabled:
            self.authorizer = Authorizer(parse_super_users(config.super_users),
                                         config.allow_everyone_if_no_acl_found)
            if not broker.cluster.enabled:
                self._local = set(self._read_file())
                self.authorizer.set_acls(self._local)
            elif "User:ANONYMOUS" not in self.authorizer.super_users:
                # Brokers talk PLAINTEXT to each other (config.validate), so a follower's
                # Fetch and a forwarded request arrive as User:ANONYMOUS and need
                # CLUSTER_ACTION, CREATE, WRITE...: without a super user entry (or ACLs
                # for it) replication stops with TOPIC_AUTHORIZATION_FAILED.
                log.warning("authorizer on in a cluster, but User:ANONYMOUS (the brokers' principal on the "
                            "PLAINTEXT inter-broker listener) is not in super-users: replication and "
                            "forwarding need it there or ACLs granting it CLUSTER_ACTION and more")

    def _read_file(self) -> list[AclBinding]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        try:
            return decode_acls(text)
        except (ValueError, KeyError, TypeError) as e:
            # Starting with fewer ACLs than the operator made could open what a DENY
            # closed; refusing to start is the safe answer.
            from ..server import StartupError
            raise StartupError(f"{self.path} is damaged ({e}); fix or remove it") from None

    def current(self) -> Authorizer | None:
        """The authorizer, its ACLs refreshed from the cluster image when they changed."""
        a = self.authorizer
        if a is not None and self.broker.cluster.enabled:
            image = self.broker.cluster.image
            if image.acl_generation != self._generation:
                self._generation = image.acl_generation
                acls = []
                for key, value in image.acls.items():
                    try:
                        acls.append(AclBinding.from_json(value))
                    except (ValueError, KeyError, TypeError) as e:
                        log.error("ACL key %s has a value this broker cannot read (%s); ignoring it", key, e)
                a.set_acls(acls)
        return a

    def describe(self, flt: AclFilter) -> list[AclBinding]:
        return sorted((b for b in self.current().acls if flt.matches(b)), key=AclBinding.key)

    async def create(self, bindings: list[AclBinding]) -> None:
        if not bindings:
            return
        if self.broker.cluster.enabled:
            await self._etcd_txn([("put", b) for b in bindings])
            return
        new = self._local | set(bindings)
        self._write(new)

    async def delete(self, filters: list[AclFilter]) -> list[list[AclBinding]]:
        """The bindings each filter matched, all of them deleted."""
        current = self.current().acls
        matched = [sorted((b for b in current if f.matches(b)), key=AclBinding.key) for f in filters]
        gone = {b for m in matched for b in m}
        if gone:
            if self.broker.cluster.enabled:
                await self._etcd_txn([("delete", b) for b in gone])
            else:
                self._write(self._local - gone)
        return matched

    def _write(self, acls: set[AclBinding]) -> None:
        try:
            replace_durably(self.path, encode_acls(acls))
        except OSError as e:
            raise AclStoreError(f"cannot write {self.path}: {e.strerror}") from None
        self._local = acls
        self.authorizer.set_acls(acls)

    async def _etcd_txn(self, ops: list[tuple[str, AclBinding]]) -> None:
        from controller.etcd import EtcdError, Op
        cluster = self.broker.cluster
        txn = [Op.put(acl_etcd_key(b), encode(b.to_json())) if what == "put" else Op.delete(acl_etcd_key(b))
               for what, b in ops]
        try:
            # One transaction: a request's ACLs appear together on every broker. etcd
            # limits a transaction to 128 operations by default.
            revision = 0
            for i in range(0, len(txn), 128):
                revision = (await cluster.store.txn([], txn[i:i + 128])).revision
        except EtcdError as e:
            raise AclStoreError(f"metadata store error: {e}") from None
        if not await cluster.wait_revision(revision):
            raise AclStoreError("the ACL change was written but has not reached this broker yet")
