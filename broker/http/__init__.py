"""The broker's HTTP port (`--http-listen`): /metrics, /status.json, the status page (/) and
the HTTP tail of a partition, served by hypercorn's Trio worker inside the broker's own
Trio process (app.py)."""
