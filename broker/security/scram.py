"""SCRAM credentials (KIP-84, KIP-554): what is stored per user and mechanism, and where.

Only salted keys are kept, never a password: per mechanism the salt, the iteration count,
StoredKey = H(HMAC(SaltedPassword, "Client Key")) and ServerKey = HMAC(SaltedPassword,
"Server Key") (RFC 5802). That is all a SCRAM server needs, and it is also enough to check
a PLAIN password: derive SaltedPassword with the stored salt and iterations and compare
the resulting StoredKey (broker/security/sasl.py).

Storage: with a metadata store, one etcd key per user, ``/canopy/users/<name>``, holding
every mechanism's credential as JSON; each broker's ClusterImage (controller/image.py)
applies those keys as they change, so every broker sees a new user at once. Without one,
a JSON file in the data directory, rewritten durably (write, fsync, rename, fsync dir).

Pure parts (credential derivation, JSON encoding, request validation) take and return
values; the two stores do the I/O.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from dataclasses import dataclass
from pathlib import Path

from protocol.errors import ErrorCode

# KIP-554's mechanism ids (Kafka's ScramMechanism enum).
MECHANISM_IDS = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}
MECHANISM_NAMES = {v: k for k, v in MECHANISM_IDS.items()}
_HASH = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
# Kafka's ScramMechanism: minIterations 4096 (its SCRAM server refuses fewer), maxIterations 16384.
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
DEFAULT_ITERATIONS = 8192   # Kafka's kafka-configs.sh default for --add-config SCRAM-...=[password=...]

CREDENTIALS_FILE = "scram-credentials.json"


class CredentialError(Exception):
    """A refused alteration: carries the Kafka error code and message for that user."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def to_json(self) -> dict:
        b64 = lambda b: base64.b64encode(b).decode()
        return {"salt": b64(self.salt), "stored_key": b64(self.stored_key),
                "server_key": b64(self.server_key), "iterations": self.iterations}

    @classmethod
    def from_json(cls, d: dict) -> "ScramCredential":
        return cls(base64.b64decode(d["salt"]), base64.b64decode(d["stored_key"]),
                   base64.b64decode(d["server_key"]), int(d["iterations"]))


def salted_password(mechanism: str, password: bytes, salt: bytes, iterations: int) -> bytes:
    """RFC 5802 Hi(): PBKDF2 with the mechanism's HMAC."""
    return hashlib.pbkdf2_hmac(_HASH[mechanism], password, salt, iterations)


def credential_from_salted_password(mechanism: str, salted: bytes, salt: bytes, iterations: int) -> ScramCredential:
    """What AlterUserScramCredentials carries (the client salts the password itself, so the
    password never crosses the wire) turned into what is stored."""
    algo = _HASH[mechanism]
    client_key = hmac.digest(salted, b"Client Key", algo)
    stored_key = hashlib.new(algo, client_key).digest()
    server_key = hmac.digest(salted, b"Server Key", algo)
    return ScramCredential(salt, stored_key, server_key, iterations)


def make_credential(mechanism: str, password: str, iterations: int = DEFAULT_ITERATIONS,
                    salt: bytes | None = None) -> ScramCredential:
    salt = os.urandom(32) if salt is None else salt
    salted = salted_password(mechanism, password.encode(), salt, iterations)
    return credential_from_salted_password(mechanism, salted, salt, iterations)


def password_matches(mechanism: str, cred: ScramCredential, password: bytes) -> bool:
    """PLAIN against a SCRAM credential: same derivation, constant-time comparison."""
    derived = credential_from_salted_password(
        mechanism, salted_password(mechanism, password, cred.salt, cred.iterations), cred.salt, cred.iterations)
    return hmac.compare_digest(derived.stored_key, cred.stored_key)


# users: {name: {mechanism name: ScramCredential}}
Users = dict[str, dict[str, ScramCredential]]


def encode_user(creds: dict[str, ScramCredential]) -> bytes:
    return json.dumps({m: c.to_json() for m, c in sorted(creds.items())}, sort_keys=True,
                      separators=(",", ":")).encode()


def decode_user(value: bytes) -> dict[str, ScramCredential]:
    data = json.loads(value)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return {str(m): ScramCredential.from_json(c) for m, c in data.items() if m in MECHANISM_IDS}


def validate_alteration(users: Users, deletions: list[dict], upsertions: list[dict]) -> tuple[dict[str, tuple[int, str | None]], Users]:
    """Apply an AlterUserScramCredentials request to a copy of ``users`` the way Kafka
    judges it. Returns ({user: (error code, message)}, one per user named, the users map
    after the accepted changes). The same user and mechanism twice in one request is
    DUPLICATE_RESOURCE (several mechanisms of one user is how kafka-configs.sh adds both
    SCRAM-SHA-256 and -512); each user's changes are all-or-nothing."""
    results: dict[str, tuple[int, str | None]] = {}
    counts: dict[tuple[str, int], int] = {}
    ops = [("delete", op) for op in deletions] + [("upsert", op) for op in upsertions]
    for _, op in ops:
        counts[(op["name"], op["mechanism"])] = counts.get((op["name"], op["mechanism"]), 0) + 1
    by_user: dict[str, list] = {}
    for kind, op in ops:
        by_user.setdefault(op["name"], []).append((kind, op))
    new = {u: dict(c) for u, c in users.items()}
    for name, mine in by_user.items():
        if any(counts[(name, op["mechanism"])] > 1 for _, op in mine):
            results[name] = (ErrorCode.DUPLICATE_RESOURCE,
                             "A user credential cannot be altered twice in the same request")
            continue
        trial = {name: dict(new.get(name, {}))}
        try:
            for kind, op in mine:
                _apply_one(trial, kind, op)
        except CredentialError as e:
            results[name] = (e.code, str(e))
            continue
        new[name] = trial[name]
        results[name] = (ErrorCode.NONE, None)
    return results, {u: c for u, c in new.items() if c}


def _apply_one(users: Users, kind: str, op: dict) -> None:
    name = op["name"]
    if not name:
        raise CredentialError(ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty")
    mech = MECHANISM_NAMES.get(op["mechanism"])
    if mech is None:
        raise CredentialError(ErrorCode.UNSUPPORTED_SASL_MECHANISM, f"Unknown SCRAM mechanism {op['mechanism']}")
    if kind == "delete":
        if mech not in users.get(name, {}):
            raise CredentialError(ErrorCode.RESOURCE_NOT_FOUND,
                                  "Attempt to delete a user credential that does not exist")
        del users[name][mech]
        return
    iterations = op["iterations"]
    if iterations < MIN_ITERATIONS:
        raise CredentialError(ErrorCode.UNACCEPTABLE_CREDENTIAL, f"Too few iterations (minimum {MIN_ITERATIONS})")
    if iterations > MAX_ITERATIONS:
        raise CredentialError(ErrorCode.UNACCEPTABLE_CREDENTIAL, f"Too many iterations (maximum {MAX_ITERATIONS})")
    if not op["salt"] or not op["salted_password"]:
        raise CredentialError(ErrorCode.UNACCEPTABLE_CREDENTIAL, "Salt and salted password must not be empty")
    users.setdefault(name, {})[mech] = credential_from_salted_password(
        mech, bytes(op["salted_password"]), bytes(op["salt"]), iterations)


def describe(users: Users, names: list[str] | None) -> list[dict]:
    """DescribeUserScramCredentials results (Kafka: every user when the list is null or
    empty; an unknown user is RESOURCE_NOT_FOUND, a user asked twice DUPLICATE_RESOURCE)."""
    if not names:
        names = sorted(users)
    out = []
    seen: set[str] = set()
    dups = {n for n in names if names.count(n) > 1}
    for name in names:
        if name in seen:
            continue
        seen.add(name)
        if name in dups:
            out.append({"user": name, "error_code": ErrorCode.DUPLICATE_RESOURCE,
                        "error_message": "Cannot describe the same user twice", "credential_infos": []})
        elif name not in users:
            out.append({"user": name, "error_code": ErrorCode.RESOURCE_NOT_FOUND,
                        "error_message": "Attempt to describe nonexistent user", "credential_infos": []})
        else:
            out.append({"user": name, "error_code": 0, "error_message": None,
                        "credential_infos": [{"mechanism": MECHANISM_IDS[m], "iterations": c.iterations}
                                             for m, c in sorted(users[name].items())]})
    return out


# -- the file store (a broker without a metadata store) -------------------------------------

def load_file(data_dir: Path) -> Users:
    path = Path(data_dir) / CREDENTIALS_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        doc = json.loads(raw)
        return {str(u): {m: ScramCredential.from_json(c) for m, c in creds.items() if m in MECHANISM_IDS}
                for u, creds in doc["users"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: unreadable SCRAM credentials ({e})") from None


def save_file(data_dir: Path, users: Users) -> None:
    from storage import replace_durably
    doc = {"users": {u: {m: c.to_json() for m, c in sorted(creds.items())} for u, creds in sorted(users.items())}}
    path = Path(data_dir) / CREDENTIALS_FILE
    replace_durably(path, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.chmod(path, 0o600)   # salted keys are still worth an offline dictionary attack


class CredentialStore:
    """The broker's SCRAM credentials: etcd's (through the cluster image) when the broker
    has a metadata store, else the data directory's file."""

    def __init__(self, broker):
        self.broker = broker
        self.cluster = broker.cluster
        self._file_users: Users | None = None
        if not self.cluster.enabled:
            try:
                self._file_users = load_file(broker.config.data_dir)
            except ValueError as e:
                from broker.server import StartupError
                raise StartupError(str(e)) from None

    def users(self) -> Users:
        if self._file_users is not None:
            return self._file_users
        out: Users = {}
        for name, data in self.cluster.image.users.items():
            try:
                out[name] = {m: ScramCredential.from_json(c) for m, c in data.items() if m in MECHANISM_IDS}
            except (ValueError, KeyError, TypeError):
                continue   # an unreadable key: that user cannot log in (the image logged it)
        return out

    def lookup(self, user: str, mechanism: str) -> ScramCredential | None:
        if self._file_users is not None:
            return self._file_users.get(user, {}).get(mechanism)
        data = self.cluster.image.users.get(user, {}).get(mechanism)
        if data is None:
            return None
        try:
            return ScramCredential.from_json(data)
        except (ValueError, KeyError, TypeError):
            return None

    async def alter(self, deletions: list[dict], upsertions: list[dict]) -> dict[str, tuple[int, str | None]]:
        """Apply an AlterUserScramCredentials request; {user: (error code, message)}."""
        if self._file_users is not None:
            results, new = validate_alteration(self._file_users, deletions, upsertions)
            if new != self._file_users:
                save_file(self.broker.config.data_dir, new)
                self._file_users = new
            return results
        return await self.cluster.controller_call(self._alter_etcd, deletions, upsertions)

    async def _alter_etcd(self, deletions, upsertions):
        from controller.etcd import Compare, Op
        from controller.image import user_key
        results, _ = validate_alteration(self.users(), deletions, upsertions)
        revision = 0
        for name in sorted(n for n, (code, _) in results.items() if code == 0):
            mine_d = [d for d in deletions if d["name"] == name]
            mine_u = [u for u in upsertions if u["name"] == name]
            for _attempt in range(5):
                one, new = validate_alteration(self.users(), mine_d, mine_u)
                results[name] = one[name]
                if one[name][0] != 0:
                    break
                key = user_key(name)
                # Compare-and-swap on the key's revision: a concurrent change of the same
                # user through another broker is re-judged against it, not overwritten.
                guard = [Compare.mod_revision(key, "=", self.cluster.image.user_revisions.get(name, 0))]
                op = Op.put(key, encode_user(new[name])) if name in new else Op.delete(key)
                r = await self.cluster.store.txn(guard, [op])
                if r.succeeded:
                    revision = max(revision, r.revision)
                    break
                await self.cluster.wait_revision(r.revision)
        if revision:
            # Answer once this broker's image holds the change: a Describe right after sees it.
            await self.cluster.wait_revision(revision)
        return results
