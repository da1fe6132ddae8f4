"""Listeners (Kafka's KIP-103): named endpoints, each with its own security protocol.

A broker listens on one or more named listeners (``INTERNAL://0.0.0.0:9092,
EXTERNAL://0.0.0.0:19092``) and advertises one address per name. A client is told the
addresses of the listener its request arrived on — the only ones it can be assumed to
reach: a client outside a container network cannot resolve the service names brokers use
among themselves, which is why Kafka images run an internal and an external listener.
Brokers talk to each other on ``inter-broker-listener-name``.

The single ``listen``/``advertise`` options are the one-listener case: a listener named
PLAINTEXT, as Kafka's own default ``listeners=PLAINTEXT://:9092`` is.

Pure: strings in, :class:`Listener` objects out.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# Security protocols this broker can serve (all of Kafka's).
SUPPORTED_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")

# Kafka's default listener.security.protocol.map: every protocol maps to the listener of
# the same name, so ``listeners=PLAINTEXT://...`` needs no map.
DEFAULT_PROTOCOL_MAP = {p: p for p in SECURITY_PROTOCOLS}

DEFAULT_LISTENER_NAME = "PLAINTEXT"

# Kafka's ListenerName is any non-empty name; upper-cased on parse (Kafka normalises with
# toUpperCase). Keep to what can appear before "://" unambiguously.
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_ENDPOINT = re.compile(r"^(?P<name>[^:/]+)://(?P<host>\[[^\]]*\]|[^:\[\]]*):(?P<port>[0-9]+)$")


class ListenerError(ValueError):
    """A malformed or inconsistent listener option (the CLI prints it as one line)."""


@dataclass(frozen=True)
class Listener:
    name: str               # upper case, e.g. "INTERNAL"
    host: str               # "" or 0.0.0.0 = every interface
    port: int
    security_protocol: str  # one of SECURITY_PROTOCOLS

    def __str__(self) -> str:
        return f"{self.name}://{_bracket(self.host)}:{self.port}"


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def parse_endpoints(text: str, option: str) -> dict[str, tuple[str, int]]:
    """``NAME://host:port,...`` -> {NAME: (host, port)}, in the order given."""
    out: dict[str, tuple[str, int]] = {}
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise ListenerError(f"{option}: no listener given")
    for part in parts:
        m = _ENDPOINT.match(part)
        if m is None:
            raise ListenerError(f"{option}: {part!r} is not NAME://HOST:PORT")
        name = m["name"].upper()
        if not _NAME.match(name):
            raise ListenerError(f"{option}: bad listener name {m['name']!r}")
        port = int(m["port"])
        if port > 65535:
            raise ListenerError(f"{option}: port {port} out of range in {part!r}")
        if name in out:
            # Kafka: "Each listener must have a different name"
            raise ListenerError(f"{option}: listener {name} appears twice")
        out[name] = (m["host"].strip("[]"), port)
    return out


def parse_protocol_map(text: str) -> dict[str, str]:
    """``NAME:PROTOCOL,...`` -> {NAME: PROTOCOL}."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, proto = part.partition(":")
        name, proto = name.strip().upper(), proto.strip().upper()
        if not sep or not name or not proto:
            raise ListenerError(f"listener-security-protocol-map: {part!r} is not NAME:PROTOCOL")
        if proto not in SECURITY_PROTOCOLS:
            raise ListenerError(f"listener-security-protocol-map: unknown security protocol {proto!r} "
                                f"for {name} (one of {', '.join(SECURITY_PROTOCOLS)})")
        out[name] = proto
    return out


@dataclass(frozen=True)
class ListenerConfig:
    listeners: tuple[Listener, ...]              # what this broker binds, in the order given
    advertised: dict[str, tuple[str, int]]       # name -> address clients are told
    inter_broker: str                            # the listener name brokers use among themselves

    def advertised_of(self, name: str) -> tuple[str, int]:
        return self.advertised[name]

    @property
    def inter_broker_address(self) -> tuple[str, int]:
        return self.advertised[self.inter_broker]


def _advertisable(host: str, port: int) -> tuple[str, int]:
    # A wildcard bind address cannot be dialled; as before listeners existed, tell clients
    # the loopback address (set advertised-listeners for anything else).
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return host, port


def build(*, listen: str, listen_given: bool, advertise: str | None, listeners: str, advertised_listeners: str,
          protocol_map: str, inter_broker_listener_name: str) -> ListenerConfig:
    """Resolve the listener options the way Kafka's KafkaConfig does, refusing mixes."""
    if listeners.strip():
        if listen_given:
            raise ListenerError("listen cannot be combined with listeners; name every listener in listeners")
        if advertise:
            raise ListenerError("advertise cannot be combined with listeners; use advertised-listeners")
        bound = parse_endpoints(listeners, "listeners")
    else:
        if advertised_listeners.strip():
            raise ListenerError("advertised-listeners needs listeners")
        from .config import parse_hostport   # the single-listener form, as it always was
        bound = {DEFAULT_LISTENER_NAME: parse_hostport(listen, "listen")}
        if advertise:
            advertised_listeners = f"{DEFAULT_LISTENER_NAME}://{_bracket_hostport(*parse_hostport(advertise, 'advertise'))}"
    pmap = dict(DEFAULT_PROTOCOL_MAP)
    if protocol_map.strip():
        # Kafka replaces the default map when one is given; so do we.
        pmap = parse_protocol_map(protocol_map)
    out = []
    for name, (host, port) in bound.items():
        proto = pmap.get(name)
        if proto is None:
            raise ListenerError(f"listener {name} has no entry in listener-security-protocol-map")
        if proto not in SUPPORTED_PROTOCOLS:
            raise ListenerError(f"listener {name}: security protocol {proto} is not supported yet "
                                f"(supported: {', '.join(SUPPORTED_PROTOCOLS)})")
        out.append(Listener(name, host, port, proto))
    seen_ports: dict[tuple[str, int], str] = {}
    for lst in out:
        key = (lst.host, lst.port)
        if key in seen_ports:
            raise ListenerError(f"listeners {seen_ports[key]} and {lst.name} bind the same address {lst.host}:{lst.port}")
        seen_ports[key] = lst.name
    advertised = {lst.name: _advertisable(lst.host, lst.port) for lst in out}
    if advertised_listeners.strip():
        given = parse_endpoints(advertised_listeners, "advertised-listeners")
        for name, (host, port) in given.items():
            if name not in advertised:
                # Kafka: advertised.listeners listener names must be equal to or a subset of listeners
                raise ListenerError(f"advertised-listeners names {name}, which is not in listeners")
            advertised[name] = _advertisable(host, port)
    if inter_broker_listener_name.strip():
        inter = inter_broker_listener_name.strip().upper()
        if inter not in advertised:
            raise ListenerError(f"inter-broker-listener-name {inter} is not one of the listeners "
                                f"({', '.join(advertised)})")
    elif len(out) == 1:
        inter = out[0].name
    elif DEFAULT_LISTENER_NAME in advertised:
        inter = DEFAULT_LISTENER_NAME   # Kafka's default: security.inter.broker.protocol=PLAINTEXT
    else:
        raise ListenerError("several listeners and none named PLAINTEXT: set inter-broker-listener-name")
    return ListenerConfig(tuple(out), advertised, inter)


def _bracket_hostport(host: str, port: int) -> str:
    return f"{_bracket(host)}:{port}"


def request_listener(ctx) -> str | None:
    """The listener a request arrived on (None for a request with no client connection)."""
    return getattr(ctx.connection, "listener", None)
