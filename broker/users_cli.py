"""`canopy users add|list|delete` — SCRAM credentials (KIP-554), like kafka-configs.sh.

Two ways to reach the credentials:

- ``--bootstrap HOST:PORT``: an ordinary Kafka client of a running broker
  (AlterUserScramCredentials / DescribeUserScramCredentials). The password is salted here
  (PBKDF2 with a fresh random salt), so only the salted password crosses the wire, as
  with Kafka's AdminClient. ``--security-protocol`` and the ``--sasl-*``/``--ssl-cafile``
  options log in to a SASL or TLS listener.
- ``--data-dir DIR`` or ``--metadata-store etcd://...``: straight to the store, for the
  first user before any broker accepts a login (Kafka's ``kafka-storage format
  --add-scram``). The data-dir form refuses while a broker holds the directory (it would
  not see the change); the etcd form is seen by every running broker at once.

The password comes from ``--password-file`` (its first line), else a prompt on a
terminal, else the first line of standard input. Errors print one line and exit 2.
"""
from __future__ import annotations

import getpass
import os
import sys
from pathlib import Path

import trio

from replication.client import PeerConnection, PeerError
from replication.client_security import ClientSecurity, client_ssl_context

from .security import scram

DESCRIBE, ALTER = 50, 51
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


class UsersError(Exception):
    """Printed as one line; exit status 2."""


def add_parser(sub) -> None:
    u = sub.add_parser("users", help="add, list or delete SCRAM users (SASL credentials)")
    usub = u.add_subparsers(dest="users_command", required=True, parser_class=type(u))
    a = usub.add_parser("add", help="create a user or change its password")
    a.add_argument("name")
    a.add_argument("--mechanism", action="append", choices=sorted(scram.MECHANISM_IDS),
                   help="SCRAM mechanism (repeatable; default both SCRAM-SHA-256 and SCRAM-SHA-512)")
    a.add_argument("--iterations", type=int, default=scram.DEFAULT_ITERATIONS,
                   help=f"PBKDF2 iterations ({scram.MIN_ITERATIONS}..{scram.MAX_ITERATIONS}, "
                        f"default {scram.DEFAULT_ITERATIONS})")
    a.add_argument("--password-file", dest="password_file", help="file whose first line is the password")
    lst = usub.add_parser("list", help="users and their SCRAM mechanisms")
    d = usub.add_parser("delete", help="remove a user's credentials")
    d.add_argument("name")
    d.add_argument("--mechanism", action="append", choices=sorted(scram.MECHANISM_IDS),
                   help="only this mechanism's credential (repeatable; default every one the user has)")
    for p in (a, lst, d):
        g = p.add_mutually_exclusive_group()
        g.add_argument("--bootstrap", help="HOST:PORT of a broker (default 127.0.0.1:9092)")
        g.add_argument("--data-dir", dest="data_dir", help="write the data directory's credentials file "
                                                           "directly (broker stopped)")
        g.add_argument("--metadata-store", dest="metadata_store",
                       help="write etcd directly: etcd://HOST:PORT[,HOST:PORT...]")
        add_client_security_args(p)


def add_client_security_args(p) -> None:
    """How a CLI command logs in to the --bootstrap listener (also `canopy cluster`)."""
    p.add_argument("--security-protocol", dest="security_protocol", choices=PROTOCOLS, default="PLAINTEXT",
                   help="of the --bootstrap listener (default PLAINTEXT)")
    p.add_argument("--sasl-mechanism", dest="sasl_mechanism", default="SCRAM-SHA-512",
                   choices=["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
    p.add_argument("--sasl-username", dest="sasl_username", default="")
    p.add_argument("--sasl-password-file", dest="sasl_password_file",
                   help="file whose first line is the --sasl-username's password")
    p.add_argument("--ssl-cafile", dest="ssl_cafile", help="PEM CA certificates to verify the broker with")


def client_security(args) -> ClientSecurity:
    """The ClientSecurity the options above describe; ValueError is a one-line error."""
    proto = args.security_protocol
    ctx = None
    if proto in ("SSL", "SASL_SSL"):
        try:
            ctx = client_ssl_context(args.ssl_cafile)
        except (OSError, ValueError) as e:
            raise ValueError(f"--ssl-cafile {args.ssl_cafile}: {e}") from None
    password = ""
    if proto.startswith("SASL"):
        if not args.sasl_username or not args.sasl_password_file:
            raise ValueError(f"--security-protocol {proto} needs --sasl-username and --sasl-password-file")
        try:
            password = _read_first_line(args.sasl_password_file, "--sasl-password-file")
        except UsersError as e:
            raise ValueError(str(e)) from None
    return ClientSecurity(proto, ctx, sasl_mechanism=args.sasl_mechanism, sasl_username=args.sasl_username,
                          sasl_password=password)


def run(args) -> int:
    try:
        lines = _run(args)
    except (UsersError, PeerError) as e:
        print(f"canopy: {e}", file=sys.stderr)
        return 2
    if lines:
        print("\n".join(lines))
    return 0


def _read_first_line(path: str, what: str) -> str:
    try:
        with open(path) as fh:
            line = fh.readline().rstrip("\r\n")
    except OSError as e:
        raise UsersError(f"{what} {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise UsersError(f"{what} {path}: not UTF-8 text") from None
    if not line:
        raise UsersError(f"{what} {path}: the first line is empty")
    return line


def _password(args) -> str:
    if args.password_file:
        return _read_first_line(args.password_file, "--password-file")
    if sys.stdin.isatty():
        first = getpass.getpass(f"password for {args.name}: ")
        if first != getpass.getpass("again: "):
            raise UsersError("the passwords do not match")
        pw = first
    else:
        pw = sys.stdin.readline().rstrip("\r\n")
    if not pw:
        raise UsersError("empty password")
    return pw


def _operations(args) -> tuple[list[dict], list[dict]]:
    """The AlterUserScramCredentials deletions/upsertions the command stands for."""
    if not args.name:
        raise UsersError("the user name must not be empty")
    if args.users_command == "add":
        if not scram.MIN_ITERATIONS <= args.iterations <= scram.MAX_ITERATIONS:
            raise UsersError(f"--iterations must be between {scram.MIN_ITERATIONS} and {scram.MAX_ITERATIONS}")
        password = _password(args).encode()
        ups = []
        for mech in dict.fromkeys(args.mechanism or ("SCRAM-SHA-256", "SCRAM-SHA-512")):
            salt = os.urandom(32)
            ups.append({"name": args.name, "mechanism": scram.MECHANISM_IDS[mech], "iterations": args.iterations,
                        "salt": salt, "salted_password": scram.salted_password(mech, password, salt, args.iterations)})
        return [], ups
    return [{"name": args.name, "mechanism": scram.MECHANISM_IDS[m]} for m in dict.fromkeys(args.mechanism)], []


def _run(args) -> list[str]:
    if args.data_dir:
        return _file_store(args)
    if args.metadata_store:
        return trio.run(_etcd_store, args)
    return trio.run(_broker, args)


def _list_lines(results: list[dict]) -> list[str]:
    out = []
    for r in results:
        if r["error_code"]:
            out.append(f"{r['user']}: error {r['error_code']} {r['error_message'] or ''}".rstrip())
            continue
        mechs = ", ".join(f"{scram.MECHANISM_NAMES.get(c['mechanism'], c['mechanism'])} (iterations "
                          f"{c['iterations']})" for c in r["credential_infos"])
        out.append(f"{r['user']}: {mechs}")
    return out


def _check(results: dict[str, tuple[int, str | None]], args) -> list[str]:
    for user, (code, msg) in results.items():
        if code:
            raise UsersError(f"{args.users_command} {user}: {msg or 'error ' + str(code)} (Kafka error {code})")
    return [f"{'deleted' if args.users_command == 'delete' else 'saved'} {args.name}"]


def _resolve_deletions(args, users: scram.Users) -> None:
    if args.users_command == "delete" and not args.mechanism:
        have = users.get(args.name)
        if not have:
            raise UsersError(f"delete {args.name}: no such user")
        args.mechanism = sorted(have)


# -- straight to a store --------------------------------------------------------------------

def _file_store(args) -> list[str]:
    from storage import DataDirLock, DataDirLocked
    data_dir = Path(args.data_dir)
    if args.users_command != "list":
        try:
            lock = DataDirLock(data_dir)
        except DataDirLocked as e:
            raise UsersError(f"{e}; stop it, or use --bootstrap to change users through it") from None
        except OSError as e:
            raise UsersError(f"data directory {data_dir}: {e.strerror}") from None
    else:
        lock = None
    try:
        try:
            users = scram.load_file(data_dir)
        except ValueError as e:
            raise UsersError(str(e)) from None
        if args.users_command == "list":
            return _list_lines(scram.describe(users, None))
        _resolve_deletions(args, users)
        deletions, upsertions = _operations(args)
        results, new = scram.validate_alteration(users, deletions, upsertions)
        lines = _check(results, args)
        scram.save_file(data_dir, new)
        return lines
    finally:
        if lock is not None:
            lock.release()


async def _etcd_store(args) -> list[str]:
    from controller.etcd import Compare, EtcdClient, EtcdError, Op, parse_endpoints
    from controller.image import USERS, user_key
    try:
        endpoints = parse_endpoints(args.metadata_store)
    except ValueError as e:
        raise UsersError(f"--metadata-store: {e}") from None
    async with EtcdClient(endpoints) as store:
        try:
            kvs, _ = await store.get_prefix(USERS)
            users, revisions = {}, {}
            for kv in kvs:
                try:
                    users[kv.key[len(USERS):]] = scram.decode_user(kv.value)
                    revisions[kv.key[len(USERS):]] = kv.mod_revision
                except (ValueError, KeyError, TypeError):
                    continue
            if args.users_command == "list":
                return _list_lines(scram.describe(users, None))
            _resolve_deletions(args, users)
            deletions, upsertions = _operations(args)
            results, new = scram.validate_alteration(users, deletions, upsertions)
            lines = _check(results, args)
            key = user_key(args.name)
            op = Op.put(key, scram.encode_user(new[args.name])) if args.name in new else Op.delete(key)
            r = await store.txn([Compare.mod_revision(key, "=", revisions.get(args.name, 0))], [op])
            if not r.succeeded:
                raise UsersError(f"{args.name} was changed concurrently; run the command again")
            return lines
        except EtcdError as e:
            raise UsersError(f"metadata store {args.metadata_store}: {e}") from None


# -- through a broker -------------------------------------------------------------------------

def _security(args) -> ClientSecurity:
    try:
        return client_security(args)
    except ValueError as e:
        raise UsersError(str(e)) from None


async def _broker(args) -> list[str]:
    from .admin_cli import AdminError, _hostport
    try:
        host, port = _hostport(args.bootstrap or "127.0.0.1:9092")
    except AdminError as e:
        raise UsersError(str(e)) from None
    conn = PeerConnection(host, port, "canopy-users", connect_timeout=5.0, security=_security(args))
    try:
        if args.users_command == "list":
            r = await conn.request(DESCRIBE, 0, {"users": None}, timeout=30)
            if r["error_code"]:
                raise UsersError(f"list: {r['error_message'] or 'error ' + str(r['error_code'])}")
            return _list_lines(r["results"])
        if args.users_command == "delete" and not args.mechanism:
            r = await conn.request(DESCRIBE, 0, {"users": [{"name": args.name}]}, timeout=30)
            res = r["results"][0] if r["results"] else None
            if res is None or res["error_code"]:
                raise UsersError(f"delete {args.name}: no such user")
            args.mechanism = [scram.MECHANISM_NAMES[c["mechanism"]] for c in res["credential_infos"]
                              if c["mechanism"] in scram.MECHANISM_NAMES]
        deletions, upsertions = _operations(args)
        r = await conn.request(ALTER, 0, {"deletions": deletions, "upsertions": upsertions}, timeout=30)
        return _check({x["user"]: (x["error_code"], x["error_message"]) for x in r["results"]}, args)
    finally:
        await conn.aclose()
