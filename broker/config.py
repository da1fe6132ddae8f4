"""Broker configuration: embedded defaults < TOML file < CANOPY_* environment < CLI flags.

Every option has one name used in all three places: `listen` is `--listen`, `listen = ...`
in the TOML file and `CANOPY_LISTEN` in the environment (compose sets them that way).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, fields
from pathlib import Path


class ConfigError(Exception):
    """A bad option; the CLI prints it as one line."""


def parse_hostport(value: str, what: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{what} must be HOST:PORT, got {value!r}")
    try:
        p = int(port)
    except ValueError:
        raise ConfigError(f"{what} must be HOST:PORT, got {value!r}") from None
    if not 0 <= p <= 65535:
        raise ConfigError(f"{what}: port {p} out of range")
    return host.strip("[]"), p


FLUSH_POLICIES = ("async", "interval", "always")
DEFAULT_LISTEN = "127.0.0.1:9092"


@dataclass
class BrokerConfig:
    data_dir: Path = Path("./data")
    listen: str = DEFAULT_LISTEN
    advertise: str | None = None          # what Metadata tells clients; defaults to listen
    # Named listeners (KIP-103; broker/listeners.py). Empty: one PLAINTEXT listener made of
    # listen/advertise, as before listeners existed.
    listeners: str = ""                    # NAME://HOST:PORT,...
    advertised_listeners: str = ""         # NAME://HOST:PORT,... (default: the bound address)
    listener_security_protocol_map: str = ""   # NAME:PROTOCOL,... (default: Kafka's, name = protocol)
    inter_broker_listener_name: str = ""   # default: the only listener, else PLAINTEXT
    # TLS (SSL listeners; broker/security/tls.py), named after Kafka's ssl.* options.
    ssl_keystore_location: str = ""        # PEM: the broker's certificate chain and private key
    ssl_key_password: str = ""             # the private key's password, if it is encrypted
    ssl_truststore_location: str = ""      # PEM CA certificates that client certificates must chain to
    ssl_client_auth: str = "none"          # none | requested | required (mTLS)
    # SASL (SASL_PLAINTEXT/SASL_SSL listeners; broker/security/sasl.py): Kafka's sasl.enabled.mechanisms
    sasl_enabled_mechanisms: str = "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"
    # How this broker logs in when the inter-broker listener is SASL_*: Kafka's
    # sasl.mechanism.inter.broker.protocol and the listener's JAAS login (username/password).
    sasl_mechanism_inter_broker_protocol: str = "SCRAM-SHA-512"
    inter_broker_sasl_username: str = ""
    inter_broker_sasl_password: str = ""
    # ACLs (broker/security/acl.py), after Kafka's authorizer.class.name, super.users and
    # allow.everyone.if.no.acl.found. Empty authorizer: no checks at all (as before ACLs).
    authorizer: str = ""                   # "" | standard (Kafka's StandardAuthorizer semantics)
    super_users: str = ""                  # principals separated by ';', e.g. User:CN=admin;User:ANONYMOUS
    allow_everyone_if_no_acl_found: bool = False
    node_id: int = 0
    cluster_id: str = "canopy-cluster"
    rack: str | None = None
    auto_create_topics: bool = True        # Kafka's auto.create.topics.enable
    num_partitions: int = 1                # Kafka's num.partitions for auto-created topics
    flush: str = "async"                   # async | interval | always
    flush_interval_ms: int = 1000
    max_request_bytes: int = 100 * 1024 * 1024   # socket.request.max.bytes
    retention_check_interval_ms: int = 60_000    # log.retention.check.interval.ms (Kafka: 5 min)
    log_retention_ms: int = 7 * 24 * 3600 * 1000
    log_retention_bytes: int = -1
    log_segment_bytes: int = 1 << 30
    log_segment_ms: int = 7 * 24 * 3600 * 1000
    message_max_bytes: int = 1048588
    # The log cleaner (compacted topics; storage/cleaner.py), Kafka's names and defaults.
    log_cleaner_enable: bool = True
    log_cleaner_backoff_ms: int = 15_000           # sleep when no partition needs cleaning
    log_cleaner_io_max_bytes_per_second: int = -1  # cleaner reads + writes; -1: unthrottled
    group_initial_rebalance_delay_ms: int = 0
    log_level: str = "info"
    log_format: str = "text"               # text | json (one JSON object per line)
    # -- observability (broker/http/) ------------------------------------------------------
    http_listen: str = ""                  # HOST:PORT of /metrics, /status.json, / and the HTTP tail; off when empty
    metrics_per_partition: bool = False    # partition labels on per-partition metrics (default: per topic)
    # -- cluster (replication trees, metadata in etcd) -------------------------------------
    # metadata_store: "etcd://HOST:PORT[,HOST:PORT...]" — etcd members holding the cluster's
    # metadata and the controller election. Empty means a single-node broker.
    metadata_store: str = ""
    fanout: int = 2                        # default children per replica in a tree
    replication_factor: int = -1           # default for new topics; -1 = every live broker
    min_insync_replicas: int = 1           # default min.insync.replicas
    unclean_leader_election_enable: bool = False   # Kafka's default too
    replica_lag_time_max_ms: int = 10_000  # Kafka's replica.lag.time.max.ms (30 s there)
    leader_failure_timeout_ms: int = 3000  # the registration lease TTL: silent this long = dead
    replica_fetch_wait_ms: int = 500       # follower long-poll (replica.fetch.wait.max.ms)
    # KIP-227 fetch sessions cached (Kafka's max.incremental.fetch.session.cache.slots);
    # 0: none, every Fetch is answered in full (broker/fetch_sessions.py)
    max_incremental_fetch_session_cache_slots: int = 1000
    offsets_topic_num_partitions: int = 8  # Kafka's offsets.topic.num.partitions (50 there)
    offsets_topic_replication_factor: int = 3   # Kafka's offsets.topic.replication.factor
    offsets_topic_segment_bytes: int = 16 << 20  # Kafka's offsets.topic.segment.bytes (100 MiB there)

    @property
    def is_cluster(self) -> bool:
        return bool(self.metadata_store.strip())

    @functools.cached_property
    def listener_config(self):
        """The resolved listeners (broker/listeners.py ListenerConfig)."""
        from .listeners import ListenerError, build
        try:
            return build(listen=self.listen, listen_given=self.listen != DEFAULT_LISTEN, advertise=self.advertise,
                         listeners=self.listeners, advertised_listeners=self.advertised_listeners,
                         protocol_map=self.listener_security_protocol_map,
                         inter_broker_listener_name=self.inter_broker_listener_name)
        except ListenerError as e:
            raise ConfigError(str(e)) from None

    @property
    def listen_addr(self) -> tuple[str, int]:
        """The inter-broker listener's bound address."""
        lc = self.listener_config
        return next((lst.host, lst.port) for lst in lc.listeners if lst.name == lc.inter_broker)

    @property
    def advertised_addr(self) -> tuple[str, int]:
        """The inter-broker listener's advertised address: what this broker registers in
        etcd as its host/port, and what other brokers dial for replication and forwarding."""
        return self.listener_config.inter_broker_address

    @property
    def http_advertised(self) -> tuple[str, int] | None:
        """Where other brokers reach this one's HTTP port: the --http-listen address, or,
        when it binds every interface (0.0.0.0 in a container), the host this broker
        advertises to other brokers with the HTTP port."""
        if not self.http_listen:
            return None
        host, port = parse_hostport(self.http_listen, "http-listen")
        if host in ("", "0.0.0.0", "::"):
            host = self.advertised_addr[0]
        return host, port

    @functools.cached_property
    def ssl_context(self):
        """The server SSLContext of SSL listeners (None when there are none)."""
        if not any(x.security_protocol in ("SSL", "SASL_SSL") for x in self.listener_config.listeners):
            return None
        from .security.tls import TLSConfigError, server_context
        try:
            return server_context(self.ssl_keystore_location, self.ssl_key_password,
                                  self.ssl_truststore_location, self.ssl_client_auth)
        except TLSConfigError as e:
            raise ConfigError(str(e)) from None

    @functools.cached_property
    def sasl_mechanisms(self) -> tuple[str, ...]:
        from .security.sasl import parse_mechanisms
        try:
            return parse_mechanisms(self.sasl_enabled_mechanisms)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    @functools.cached_property
    def inter_broker_security(self):
        """How replication, forwarding and the admin paths dial other brokers: the client
        side of the inter-broker listener's security protocol (replication/client_security.py).
        TLS trusts ssl-truststore-location (the system CAs when unset, as Kafka's JVM default)
        and presents the broker's keystore as its client certificate, as a Kafka broker does."""
        from replication.client_security import PLAINTEXT, SASL_MECHANISMS, ClientSecurity, client_ssl_context
        lc = self.listener_config
        proto = next(x.security_protocol for x in lc.listeners if x.name == lc.inter_broker)
        if proto == "PLAINTEXT":
            return PLAINTEXT
        ctx = None
        if proto in ("SSL", "SASL_SSL"):
            try:
                ctx = client_ssl_context(self.ssl_truststore_location or None, self.ssl_keystore_location or None,
                                         None, self.ssl_key_password or None)
            except (OSError, ValueError) as e:
                raise ConfigError(f"inter-broker TLS client: {e}") from None
        mech = self.sasl_mechanism_inter_broker_protocol.strip().upper()
        if proto.startswith("SASL"):
            if mech not in SASL_MECHANISMS:
                raise ConfigError(f"sasl-mechanism-inter-broker-protocol: unsupported mechanism {mech!r} "
                                  f"(supported: {', '.join(SASL_MECHANISMS)})")
            if mech not in self.sasl_mechanisms:
                raise ConfigError(f"sasl-mechanism-inter-broker-protocol {mech} is not in sasl-enabled-mechanisms")
            if not self.inter_broker_sasl_username or not self.inter_broker_sasl_password:
                raise ConfigError(f"inter-broker listener {lc.inter_broker} is {proto}: set inter-broker-sasl-username "
                                  "and inter-broker-sasl-password (the user this broker logs in as)")
        return ClientSecurity(proto, ctx, sasl_mechanism=mech, sasl_username=self.inter_broker_sasl_username,
                              sasl_password=self.inter_broker_sasl_password)

    def validate(self) -> "BrokerConfig":
        lc = self.listener_config
        self.ssl_context
        self.sasl_mechanisms
        if self.ssl_client_auth not in ("none", "requested", "required"):
            raise ConfigError(f"ssl-client-auth must be one of none, requested, required, got {self.ssl_client_auth!r}")
        if self.is_cluster:
            self.inter_broker_security
        if self.authorizer.strip().lower() in ("", "none"):
            self.authorizer = ""
        elif self.authorizer.strip().rpartition(".")[2].lower() in ("standard", "standardauthorizer", "aclauthorizer"):
            self.authorizer = "standard"
        else:
            raise ConfigError(f"authorizer must be 'standard' (Kafka's StandardAuthorizer) or empty, "
                              f"got {self.authorizer!r}")
        if self.log_format not in ("text", "json"):
            raise ConfigError(f"log-format must be text or json, got {self.log_format!r}")
        if self.http_listen:
            parse_hostport(self.http_listen, "http-listen")
        if self.flush not in FLUSH_POLICIES:
            raise ConfigError(f"flush must be one of {', '.join(FLUSH_POLICIES)}, got {self.flush!r}")
        if self.node_id < 0:
            raise ConfigError(f"node-id must be >= 0, got {self.node_id}")
        if self.is_cluster:
            from controller.etcd import parse_endpoints
            try:
                parse_endpoints(self.metadata_store)
            except ValueError as e:
                raise ConfigError(f"metadata-store: {e}") from None
            if self.fanout < 1:
                raise ConfigError("fanout must be >= 1")
            if self.offsets_topic_num_partitions < 1 or self.offsets_topic_replication_factor < 1:
                raise ConfigError("offsets-topic-num-partitions and offsets-topic-replication-factor must be >= 1")
            if self.leader_failure_timeout_ms < 1000:
                raise ConfigError("leader-failure-timeout-ms must be >= 1000 (etcd leases count whole seconds)")
        if self.num_partitions < 1:
            raise ConfigError("num-partitions must be >= 1")
        for name in ("flush_interval_ms", "max_request_bytes", "message_max_bytes", "log_segment_bytes"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name.replace('_', '-')} must be > 0")
        return self


def _coerce(name: str, typ, value):
    if isinstance(value, str):
        if typ in (bool, "bool"):
            low = value.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ConfigError(f"{name}: expected true/false, got {value!r}")
        if typ in (int, "int"):
            try:
                return int(value)
            except ValueError:
                raise ConfigError(f"{name}: expected an integer, got {value!r}") from None
        if typ in (Path, "Path"):
            return Path(value)
        return value
    if typ in (Path, "Path") and value is not None:
        return Path(value)
    if typ in (int, "int") and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{name}: expected an integer, got {value!r}")
    if typ in (bool, "bool") and not isinstance(value, bool):
        raise ConfigError(f"{name}: expected true/false, got {value!r}")
    return value


def _field_types() -> dict[str, object]:
    out = {}
    for f in fields(BrokerConfig):
        t = f.type if not isinstance(f.type, str) else f.type.split("|")[0].strip()
        out[f.name] = {"Path": Path, "int": int, "bool": bool, "str": str}.get(t, t)
    return out


def load_config(cli: dict, environ: dict | None = None) -> BrokerConfig:
    """Merge the layers. ``cli`` holds only options given on the command line."""
    environ = os.environ if environ is None else environ
    types = _field_types()
    values: dict = {}
    config_file = cli.get("config") or environ.get("CANOPY_CONFIG")
    if config_file:
        import tomllib   # only with a config file: ~10 ms of every start otherwise

        try:
            with open(config_file, "rb") as fh:
                doc = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"config file {config_file} not found") from None
        except (tomllib.TOMLDecodeError, OSError) as e:
            raise ConfigError(f"config file {config_file}: {e}") from None
        for key, value in doc.items():
            name = key.replace("-", "_")
            if name not in types:
                raise ConfigError(f"config file {config_file}: unknown option {key!r}")
            values[name] = _coerce(key, types[name], value)
    for name, typ in types.items():
        env = "CANOPY_" + name.upper()
        if env in environ:
            values[name] = _coerce(env, typ, environ[env])
    for name, value in cli.items():
        if name != "config" and value is not None:
            values[name] = _coerce("--" + name.replace("_", "-"), types[name], value)
    return BrokerConfig(**values).validate()
