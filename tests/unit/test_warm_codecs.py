"""A broker builds every served version's codecs when it starts (broker/handlers
build_codecs, called by broker/server.py before the startup heap is frozen), so a fresh
broker's first requests do not build them."""
from __future__ import annotations

from broker.handlers import HANDLERS, build_codecs
from protocol.messages import api


def test_every_served_version_is_built():
    for key in HANDLERS:   # a cache: earlier tests may have filled it
        api(key).request._codecs.clear()
        api(key).response._codecs.clear()
    build_codecs()
    for key, m in HANDLERS.items():
        a = api(key)
        for v in range(m.MIN_VERSION, m.MAX_VERSION + 1):
            assert v in a.request._codecs and v in a.response._codecs, (key, v)
