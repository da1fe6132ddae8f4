"""`make pipeline`: generate click events into canopy and run the click-count job once.

Uses the broker listening on --bootstrap (default 127.0.0.1:9092, what `make run` serves);
if nothing listens there, starts `canopy serve --data-dir ./data --listen <bootstrap>` for
the duration of the run and stops it afterwards. Output: Parquet under out/click_counts,
JSON counts in topic click-counts, checkpoint in out/checkpoint (delete out/ to start over;
keep it and run again to process only new events).
"""
from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def listening(hostport: str) -> bool:
    host, port = hostport.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--data-dir", default=str(ROOT / "data"))
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--minutes", type=int, default=15)
    ap.add_argument("--out", default=str(ROOT / "out"))
    a = ap.parse_args(argv)

    broker = None
    if not listening(a.bootstrap):
        canopy = Path(sys.executable).parent / "canopy"
        print(f"no broker on {a.bootstrap}: starting {canopy} serve --data-dir {a.data_dir}")
        broker = subprocess.Popen([str(canopy), "serve", "--data-dir", a.data_dir, "--listen", a.bootstrap])
        deadline = time.monotonic() + 20
        while not listening(a.bootstrap):
            if broker.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"canopy did not start on {a.bootstrap}")
            time.sleep(0.1)
    try:
        from pipelines import click_counts, generate_clicks

        # a fresh stretch of event time on each run, so re-running adds new windows
        start = time.strftime("%Y-%m-%dT%H:%M:00+00:00", time.gmtime())
        generate_clicks.main(["--bootstrap", a.bootstrap, "--events", str(a.events),
                              "--minutes", str(a.minutes), "--start", start])
        click_counts.main(["--bootstrap", a.bootstrap,
                           "--parquet", str(Path(a.out) / "click_counts"),
                           "--checkpoint", str(Path(a.out) / "checkpoint"),
                           "--max-offsets-per-trigger", "10000"])
    finally:
        if broker is not None:
            broker.terminate()
            broker.wait(10)


if __name__ == "__main__":
    main()
