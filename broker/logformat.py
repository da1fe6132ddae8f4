"""Log output: Python's text lines, or one JSON object per line (`--log-format json`) for
log shippers (Loki, Elasticsearch, CloudWatch) that index fields instead of parsing text."""
from __future__ import annotations

import json
import logging
import sys
import time


class JsonFormatter(logging.Formatter):
    """{"ts", "level", "logger", "msg"} plus "exc" when an exception is logged; the
    message is rendered once, so a line is the same text the text format shows."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + ".%03dZ" % record.msecs,
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # httpx logs every etcd request at INFO; canopy logs what matters about etcd itself.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # hypercorn's own error log says what canopy's HTTP server logs anyway.
    logging.getLogger("hypercorn.error").setLevel(logging.WARNING)
