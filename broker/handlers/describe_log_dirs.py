"""DescribeLogDirs (key 35), versions 1-4.

v1 is the same as v0 (which Kafka 4 removed); v2 flexible; v3 a top-level error code;
v4 total_bytes / usable_bytes of the directory's file system. (v5 adds is_cordoned: not
served.) canopy has one log directory per broker (``<data-dir>/topics``); each partition
this broker holds a replica of is listed with its size on disk and its offset lag (high
watermark minus log end offset, never negative, as Kafka computes it for current
replicas). ``topics`` null means every partition.
"""
import os

from protocol.messages import ApiKey

API_KEY = ApiKey.DESCRIBE_LOG_DIRS
MIN_VERSION, MAX_VERSION = 1, 4


def _partition(p) -> dict:
    return {"partition_index": p.index, "partition_size": p.log.size_bytes,
            "offset_lag": max(0, p.high_watermark - p.log.log_end_offset), "is_future_key": False}


async def handle(ctx, request: dict, version: int) -> dict:
    registry = ctx.broker.topics
    wanted = request.get("topics")
    topics = []
    if wanted is None:
        for t in sorted(registry.topics.values(), key=lambda t: t.name):
            parts = [_partition(p) for p in t.partitions if p.is_replica]
            if parts:
                topics.append({"name": t.name, "partitions": parts})
    else:
        for w in wanted:
            t = registry.get(w["topic"])
            if t is None:
                continue   # Kafka leaves out partitions this broker does not hold
            parts = [_partition(t.partitions[i]) for i in w["partitions"]
                     if 0 <= i < len(t.partitions) and t.partitions[i].is_replica]
            if parts:
                topics.append({"name": t.name, "partitions": parts})
    root = registry.root
    try:
        st = os.statvfs(root)
        total, usable = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    except OSError:
        total = usable = -1
    return {"throttle_time_ms": 0, "error_code": 0, "results": [
        {"error_code": 0, "log_dir": str(root.resolve()), "topics": topics,
         "total_bytes": total, "usable_bytes": usable}]}
