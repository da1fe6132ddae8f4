"""`canopy serve ...` (also `python -m broker serve ...`).

Errors a user can cause (bad option, busy port, a data directory another broker holds)
print one line and exit 2 — never a traceback."""
from __future__ import annotations

import argparse
import sys

from .config import ConfigError, load_config


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage dump
        print(f"canopy: {message}", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="canopy", description="A Kafka-compatible broker.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    s = sub.add_parser("serve", help="run a broker")
    s.add_argument("--data-dir", dest="data_dir", help="data directory (default ./data)")
    s.add_argument("--listen", help="HOST:PORT to listen on (default 127.0.0.1:9092)")
    s.add_argument("--advertise", help="HOST:PORT clients are told to connect to")
    s.add_argument("--listeners", help="named listeners NAME://HOST:PORT,... (instead of --listen)")
    s.add_argument("--advertised-listeners", dest="advertised_listeners",
                   help="NAME://HOST:PORT,... clients of each listener are told to connect to")
    s.add_argument("--listener-security-protocol-map", dest="listener_security_protocol_map",
                   help="NAME:PROTOCOL,... (default: each protocol name is a listener of that protocol)")
    s.add_argument("--inter-broker-listener-name", dest="inter_broker_listener_name",
                   help="the listener brokers use among themselves")
    s.add_argument("--ssl-keystore-location", dest="ssl_keystore_location",
                   help="PEM file with the broker's certificate chain and private key (SSL listeners)")
    s.add_argument("--ssl-key-password", dest="ssl_key_password", help="password of an encrypted private key")
    s.add_argument("--ssl-truststore-location", dest="ssl_truststore_location",
                   help="PEM CA certificates client certificates are verified against")
    s.add_argument("--ssl-client-auth", dest="ssl_client_auth", choices=["none", "requested", "required"])
    s.add_argument("--sasl-enabled-mechanisms", dest="sasl_enabled_mechanisms",
                   help="SASL mechanisms of SASL listeners (default PLAIN,SCRAM-SHA-256,SCRAM-SHA-512)")
    s.add_argument("--sasl-mechanism-inter-broker-protocol", dest="sasl_mechanism_inter_broker_protocol",
                   help="SASL mechanism this broker logs in with on a SASL inter-broker listener")
    s.add_argument("--inter-broker-sasl-username", dest="inter_broker_sasl_username")
    s.add_argument("--inter-broker-sasl-password", dest="inter_broker_sasl_password",
                   help="(better: CANOPY_INTER_BROKER_SASL_PASSWORD or the TOML file)")
    s.add_argument("--authorizer", help="'standard' turns ACLs on (Kafka's StandardAuthorizer semantics)")
    s.add_argument("--super-users", dest="super_users",
                   help="principals allowed everything, separated by ';' (User:CN=admin;User:ANONYMOUS)")
    s.add_argument("--allow-everyone-if-no-acl-found", dest="allow_everyone_if_no_acl_found",
                   choices=["true", "false"])
    s.add_argument("--node-id", dest="node_id", type=int, help="this broker's node id")
    s.add_argument("--config", help="TOML config file")
    s.add_argument("--flush", choices=["async", "interval", "always"], help="flush policy")
    s.add_argument("--flush-interval-ms", dest="flush_interval_ms", type=int)
    s.add_argument("--num-partitions", dest="num_partitions", type=int,
                   help="partitions of auto-created topics")
    s.add_argument("--auto-create-topics", dest="auto_create_topics", choices=["true", "false"])
    s.add_argument("--max-request-bytes", dest="max_request_bytes", type=int)
    s.add_argument("--log-cleaner-io-max-bytes-per-second", dest="log_cleaner_io_max_bytes_per_second",
                   type=int, help="throttle of the log cleaner's disk reads + writes (-1: none)")
    s.add_argument("--log-cleaner-backoff-ms", dest="log_cleaner_backoff_ms", type=int,
                   help="how long the log cleaner sleeps when no partition needs cleaning")
    s.add_argument("--rack")
    s.add_argument("--metadata-store", dest="metadata_store",
                   help="cluster: etcd://HOST:PORT[,HOST:PORT...] holding the cluster's metadata")
    s.add_argument("--unclean-leader-election-enable", dest="unclean_leader_election_enable",
                   choices=["true", "false"])
    s.add_argument("--offsets-topic-num-partitions", dest="offsets_topic_num_partitions", type=int)
    s.add_argument("--offsets-topic-replication-factor", dest="offsets_topic_replication_factor", type=int)
    s.add_argument("--fanout", type=int, help="cluster: default children per replica")
    s.add_argument("--min-insync-replicas", dest="min_insync_replicas", type=int)
    s.add_argument("--replica-lag-time-max-ms", dest="replica_lag_time_max_ms", type=int)
    s.add_argument("--leader-failure-timeout-ms", dest="leader_failure_timeout_ms", type=int)
    s.add_argument("--log-level", dest="log_level", choices=["debug", "info", "warning", "error"])
    s.add_argument("--log-format", dest="log_format", choices=["text", "json"],
                   help="text (default) or json: one JSON object per log line")
    s.add_argument("--http-listen", dest="http_listen",
                   help="HOST:PORT serving /metrics, /status.json, the status page and the HTTP tail (default off)")
    s.add_argument("--metrics-per-partition", dest="metrics_per_partition", choices=["true", "false"],
                   help="label per-partition metrics by partition, not only by topic")
    from . import admin_cli
    admin_cli.add_parser(sub)   # `canopy cluster describe|promote`
    from . import users_cli
    users_cli.add_parser(sub)   # `canopy users add|list|delete`
    from . import acl_cli
    acl_cli.add_parser(sub)     # `canopy acls add|list|remove`
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "cluster":
        from .admin_cli import run
        return run(args)
    if args.command == "users":
        from .users_cli import run
        return run(args)
    if args.command == "acls":
        from .acl_cli import run
        return run(args)
    if args.command == "serve":
        cli = {k: v for k, v in vars(args).items() if k != "command" and v is not None}
        try:
            config = load_config(cli)
        except ConfigError as e:
            print(f"canopy: {e}", file=sys.stderr)
            return 2
        from .logformat import configure_logging
        configure_logging(config.log_level, config.log_format)
        from .server import StartupError, serve
        try:
            serve(config)
        except StartupError as e:
            print(f"canopy: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
