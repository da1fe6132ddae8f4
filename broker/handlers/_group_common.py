"""Helpers shared by the group handlers (JoinGroup ... DescribeGroups)."""


def client_host(ctx) -> str:
    # Kafka reports the member's address as InetAddress.toString(): "/127.0.0.1".
    peer = getattr(ctx.connection, "peer", "") or ""
    host = peer.rsplit(":", 1)[0] if ":" in peer else peer
    return "/" + host


def client_id(ctx) -> str:
    return getattr(ctx.header, "client_id", None) or ""
