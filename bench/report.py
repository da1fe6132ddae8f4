"""Markdown tables and matplotlib charts for a bench report (see run.py)."""
from __future__ import annotations

from pathlib import Path

KAFKA = ("canopy", "tansu", "nafka")
OTHERS = ("redis", "nats", "rabbitmq")
LABEL = {"canopy": "canopy (disk)", "tansu": "Tansu (in-memory only)",
         "nafka": "nafka (SQLite)", "redis": "Redis streams*", "nats": "NATS JetStream*",
         "rabbitmq": "RabbitMQ streams*"}


def get(rep: dict, broker: str, *path):
    node = rep["runs"].get(broker)
    for p in path:
        if not isinstance(node, dict) or p not in node:
            return None
        node = node[p]
    return node


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:,.3f}".rstrip("0").rstrip(".") if abs(v) < 1 else f"{v:,.1f}".rstrip(
        "0").rstrip(".")


def ratio(a, b) -> str:
    return f"{a / b:.2f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) \
        and b else "-"


def table(head: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(head) + " |",
           "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    out += ["| " + " | ".join(fmt(c) if not isinstance(c, str) else c for c in r) + " |"
            for r in rows]
    return "\n".join(out) + "\n"


def kafka_table(rep: dict, rows_spec) -> str:
    present = [b for b in KAFKA if b in rep["runs"]]
    peers = [b for b in present if b != "canopy"]
    head = ["figure"] + [LABEL[b] for b in present] + [f"canopy/{p}" for p in peers
                                                      if "canopy" in present]
    rows = []
    for label, path in rows_spec:
        vals = [get(rep, b, *path) for b in present]
        if all(v is None for v in vals):
            continue
        row = [label] + vals
        if "canopy" in present:
            row += [ratio(get(rep, "canopy", *path), get(rep, p, *path)) for p in peers]
        rows.append(row)
    return table(head, rows) if rows else ""


def w1_rows(rep: dict):
    spec = []
    for size in rep["config"]["sizes"]:
        s = "1 KiB" if size == 1024 else f"{size} B"
        for ph in ("produce", "consume"):
            spec += [(f"{ph} {s} msg/s", ("W1", f"{ph}_{size}", "msg_per_s")),
                     (f"{ph} {s} MB/s", ("W1", f"{ph}_{size}", "mb_per_s")),
                     (f"{ph} {s} broker CPU µs/msg",
                      ("W1", f"{ph}_{size}", "broker_cpu_us_per_msg"))]
        spec.append((f"peak RSS MB after {s}", ("W1", f"consume_{size}", "peak_rss_mb")))
    size = rep["config"]["sizes"][0]
    spec += [("produce 1 KiB acks=all msg/s", ("W1", f"produce_all_{size}", "msg_per_s")),
             ("produce 1 KiB acks=all broker CPU µs/msg",
              ("W1", f"produce_all_{size}", "broker_cpu_us_per_msg"))]
    spec += [(f"kafka-python produce 1 KiB msg/s", ("W1", f"kp_produce_{size}", "msg_per_s")),
             (f"kafka-python consume 1 KiB msg/s", ("W1", f"kp_consume_{size}", "msg_per_s"))]
    return spec


W2_ROWS = [
    ("round trip p50 µs", ("W2", "round_trip", "p50_us")),
    ("round trip p99 µs", ("W2", "round_trip", "p99_us")),
    ("round trip p99.9 µs", ("W2", "round_trip", "p999_us")),
    ("round trip broker CPU µs/msg", ("W2", "round_trip", "broker_cpu_us_per_msg")),
    ("end-to-end achieved msg/s", ("W2", "end_to_end", "achieved_rate")),
    ("end-to-end p50 µs", ("W2", "end_to_end", "p50_us")),
    ("end-to-end p99 µs", ("W2", "end_to_end", "p99_us")),
    ("end-to-end p99.9 µs", ("W2", "end_to_end", "p999_us")),
    ("end-to-end broker CPU µs/msg", ("W2", "end_to_end", "broker_cpu_us_per_msg")),
]

W4_ROWS = [
    ("create topic s (median of 3 creates)", ("W4", "create_seconds")),
    ("Metadata v1 response bytes", ("W4", "metadata", "bytes")),
    ("Metadata v1 first answer µs", ("W4", "metadata", "first_us")),
    ("Metadata v1 p50 µs", ("W4", "metadata", "p50_us")),
    ("100 producers' first metadata s", ("W4", "producers_metadata_seconds")),
    ("produce msg/s (100 B, all partitions)", ("W4", "produce", "msg_per_s")),
    ("produce broker CPU µs/msg", ("W4", "produce", "broker_cpu_us_per_msg")),
    ("peak RSS MB", ("W4", "produce", "peak_rss_mb")),
]


def passes_note(rep: dict) -> str:
    lines = []
    for b in KAFKA:
        w1 = get(rep, b, "W1") or {}
        per = [f"{k} {'/'.join(fmt(x) for x in v['passes_msg_per_s'])}"
               for k, v in w1.items() if isinstance(v, dict) and len(
                   v.get("passes_msg_per_s", [])) > 1]
        if per:
            lines.append(f"- {b} msg/s per pass: " + "; ".join(per))
    return ("\n" + "\n".join(lines) + "\n") if lines else ""


def targets(rep: dict) -> str:
    g = lambda b, *p: get(rep, b, *p)  # noqa: E731
    rows = []

    def add(name, value, want, ok):
        rows.append([name, value if value is not None else "-", want,
                     "-" if value is None else ("met" if ok(value) else "**missed**")])

    def r(a, b):
        return round(a / b, 2) if a is not None and b else None

    add("W1 produce msg/s canopy/Tansu", r(g("canopy", "W1", "produce_1024", "msg_per_s"),
                                           g("tansu", "W1", "produce_1024", "msg_per_s")),
        "≥ 1.0", lambda v: v >= 1.0)
    add("W1 consume msg/s canopy/Tansu", r(g("canopy", "W1", "consume_1024", "msg_per_s"),
                                           g("tansu", "W1", "consume_1024", "msg_per_s")),
        "≥ 1.0", lambda v: v >= 1.0)
    for ph in ("produce", "consume"):
        add(f"W1 {ph} broker CPU/msg canopy/Tansu",
            r(g("canopy", "W1", f"{ph}_1024", "broker_cpu_us_per_msg"),
              g("tansu", "W1", f"{ph}_1024", "broker_cpu_us_per_msg")), "≤ 1.0",
            lambda v: v <= 1.0)
    add("W2 round trip p50 canopy/Tansu", r(g("canopy", "W2", "round_trip", "p50_us"),
                                            g("tansu", "W2", "round_trip", "p50_us")),
        "≤ 1.3", lambda v: v <= 1.3)
    add("W1 produce msg/s canopy/nafka", r(g("canopy", "W1", "produce_1024", "msg_per_s"),
                                           g("nafka", "W1", "produce_1024", "msg_per_s")),
        "≥ 3", lambda v: v >= 3)
    add("W1 consume msg/s canopy/nafka", r(g("canopy", "W1", "consume_1024", "msg_per_s"),
                                           g("nafka", "W1", "consume_1024", "msg_per_s")),
        "≥ 30", lambda v: v >= 30)
    return table(["target (1 KiB, confluent-kafka)", "ratio", "wanted", ""], rows)


def markdown(rep: dict, stamp: str) -> str:
    m, cfg = rep["machine"], rep["config"]
    out = [f"# canopy benchmark {rep['timestamp']} (git {rep['git']})\n",
           f"Machine: {m['cpus']} vCPU {m['cpu_model']}, Linux {m['kernel']}, Python "
           f"{m['python']}; {m['note']}. Load average at start {m['loadavg_at_start']}, at "
           f"end {rep['loadavg_at_end']}; wall time {rep['wall_seconds']} s. Clients: "
           + ", ".join(f"{k} {v}" for k, v in rep["client"].items()) + ".\n",
           "Ratios are canopy ÷ peer from this one run (> 1 is better for msg/s, worse for "
           "µs and CPU). **Tansu keeps records in memory only; canopy writes every record to "
           "its mmap'd log on disk** (flush=async). Broker CPU = utime+stime of the broker "
           "process tree from /proc/<pid>/stat (10 ms ticks).\n"]
    out.append("## Targets\n\n" + targets(rep))
    out.append(f"## W1 throughput — 1 partition, {cfg['records']:,} records per size, acks=1, "
               f"linger.ms=5, batch 1 MiB, no compression; consume from offset 0 with assign. "
               f"confluent-kafka, best of {cfg.get('passes', 1)} passes (a pass over 5 s ends "
               f"the series); acks=all and kafka-python rows: one pass, kafka-python "
               f"{cfg['kp_records']:,} records.\n\n"
               + kafka_table(rep, w1_rows(rep)) + passes_note(rep))
    out.append(f"## W2 latency — {cfg['round_trips']:,} sequential acks=1 produces of 100 B "
               f"(linger.ms=0, includes librdkafka's own wakeups); end-to-end at "
               f"{cfg['e2e_rate']:,} msg/s for {cfg['e2e_seconds']} s\n\n"
               + kafka_table(rep, W2_ROWS))
    a, b = get(rep, "canopy", "W3"), get(rep, "canopy-always", "W3")
    if a or b:
        rows = []
        for label, path in (("produce msg/s", ("produce", "msg_per_s")),
                            ("produce MB/s", ("produce", "mb_per_s")),
                            ("broker CPU µs/msg", ("produce", "broker_cpu_us_per_msg")),
                            ("round trip p50 µs", ("round_trip", "p50_us")),
                            ("round trip p99 µs", ("round_trip", "p99_us"))):
            va = get(rep, "canopy", "W3", *path)
            vb = get(rep, "canopy-always", "W3", *path)
            rows.append([label, va, vb, ratio(vb, va)])
        out.append(f"## W3 durability cost — canopy, {cfg['w3_producers']} concurrent "
                   f"confluent producers (acks=all, linger.ms=5), {cfg['w3_records']:,} × 1 KiB\n\n"
                   + table(["figure", "flush=async", "flush=always (group commit)",
                            "always/async"], rows))
    w4 = kafka_table(rep, W4_ROWS)
    if w4:
        out.append(f"## W4 scale — {cfg['w4_partitions']:,} partitions, "
                   f"{cfg['w4_producers']} producers × {cfg['w4_per_producer']} records "
                   f"round-robin over the partitions (nafka: one partition per topic, "
                   f"not run)\n\n" + w4)
    w5 = get(rep, "canopy", "W5")
    if w5 and w5.get("sizes"):
        sizes = w5["sizes"]
        cols = list(sizes)
        rows = [["log on disk GB"] + [round(sizes[c]["log_bytes"] / 1e9, 2) for c in cols]]
        for case, label in (("clean", "clean stop (snapshots at the log end)"),
                            ("after_kill", "SIGKILL (last roll's snapshot + tail)"),
                            ("no_snapshots", "no snapshot files (whole-log replay)")):
            for key, fig in (("listening_seconds", "listening s"),
                             ("offsets_for_times_seconds", "first offsets-for-times answer s"),
                             ("first_fetch_seconds", "first deep fetch answer s")):
                rows.append([f"{label}: {fig}"] + [sizes[c][case][key] for c in cols])
            # the disk's answer time just before this start (older results lack it)
            disk = [sizes[c][case].get("disk_read_ms") for c in cols]
            if any(disk):
                rows.append([f"{label}: disk 4 KiB read before start, median / max ms"]
                            + [f"{d['median']} / {d['max']}" + (
                                f" (after {d['waited_s']} s, {d['stalls']} stalls)" if "waited_s" in d else "")
                               if d else "-" for d in disk])
            # where the time went (bench/brokers.py StartWatch; older results lack it)
            for key, stretch in (("start", "to listening"), ("to_first_answer", "to the first answer")):
                split = [sizes[c][case].get(key) or {} for c in cols]
                if any("on_cpu_s" in p for p in split):
                    rows.append([f"{label}: {stretch}, on a CPU / waiting for one / other s; "
                                 "MB the broker read from the disk"]
                                + [f"{p['on_cpu_s']} / {p['waiting_for_cpu_s']} / {p['other_s']}; "
                                   f"{p.get('disk_read_mb', '-')}"
                                   if "on_cpu_s" in p else "-" for p in split])
        rows.append(["peak RSS MB (clean restart, after the full read)"]
                    + [sizes[c].get("peak_rss_mb") for c in cols])
        first = cols[0]
        # Not named `ratio`: that would make the module's ratio() a local of this whole
        # function, unbound where W3's rows call it above.
        vs_first = ["first fetch answer, clean / after kill / no snapshots, vs " + first + " GiB"]
        for c in cols:
            vs_first.append(" / ".join(
                f"{sizes[c][k]['first_fetch_seconds'] / max(sizes[first][k]['first_fetch_seconds'], 1e-3):.2f}"
                for k in ("clean", "after_kill", "no_snapshots")))
        rows.append(vs_first)
        out.append(f"## W5 restart — canopy restarted on {w5['partitions']} partitions filled "
                   f"through the broker (idempotent producer, {w5['record_bytes']} B records), "
                   f"page cache {'dropped' if w5['drop_caches'] else 'NOT dropped (no root)'} "
                   f"before each restart; times from spawn, for the last partition at 90 % of "
                   f"its log; load average at the end {w5.get('loadavg_at_end')}\n\n"
                   + table(["figure"] + [f"{c} GiB" for c in cols], rows))
    others = [o for o in OTHERS if o in rep["runs"]]
    if others:
        rows = []
        for size in cfg["sizes"]:
            for ph in ("produce", "consume"):
                for fig, key in (("msg/s", "msg_per_s"), ("broker CPU µs/msg",
                                                           "broker_cpu_us_per_msg")):
                    path = (f"{ph}_{size}", key)
                    rows.append([f"{ph} {size} B {fig}", get(rep, "canopy", "W1", *path)]
                                + [get(rep, o, "other", "w1", *path) for o in others])
        rows.append(["round trip p50 µs", get(rep, "canopy", "W2", "round_trip", "p50_us")]
                    + [get(rep, o, "other", "w2", "round_trip", "p50_us") for o in others])
        rows.append(["round trip p99 µs", get(rep, "canopy", "W2", "round_trip", "p99_us")]
                    + [get(rep, o, "other", "w2", "round_trip", "p99_us") for o in others])
        out.append("## Non-Kafka comparison (*own protocol and own Python client: redis-py "
                   "pipelines of 1 000 XADD / XREAD COUNT 10000; nats-py publish_async in "
                   "windows of 1 000 / pull fetch 1 000; rstream send_batch 1 000 / "
                   "subscribe) — canopy column is confluent-kafka from W1/W2, for scale, "
                   "not a like-for-like ratio\n\n"
                   + table(["figure", "canopy"] + [LABEL[o] for o in others], rows))
    prof = get(rep, "canopy", "profile")
    if prof:
        lines = ["## Where canopy's time goes under W1 (py-spy self time, 200 Hz)\n"]
        for ph, p in prof.items():
            f = p.get("figures_under_profiler", {})
            lines.append(f"{ph}: {p['samples']} samples (stacks: `{p['stacks']}`), "
                         f"{fmt(f.get('msg_per_s'))} msg/s while sampled\n")
            lines += [f"- {pc:.1f}% `{fn}`" for fn, pc in p["top_self"]]
            lines.append("")
        out.append("\n".join(lines))
    notes = rep.get("notes", {})
    if notes:
        out.append("## Brokers\n\n" + "\n".join(f"- **{k}**: {v}" for k, v in notes.items())
                   + "\n")
    if rep["errors"]:
        out.append("## Errors\n\n" + "\n".join(
            f"- {k}: `{v.splitlines()[0][:300]}`" for k, v in rep["errors"].items()) + "\n")
    return "\n".join(out)


def charts(rep: dict, results: Path, stamp: str) -> list[Path]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    made = []
    names = [b for b in KAFKA + OTHERS if b in rep["runs"]]
    sizes = rep["config"]["sizes"]
    phases = [(ph, s) for s in sizes for ph in ("produce", "consume")]

    def w1(b, ph, s, key):
        return get(rep, b, "W1", f"{ph}_{s}", key) if b in KAFKA else get(
            rep, b, "other", "w1", f"{ph}_{s}", key)

    for key, title, fname, log in (
            ("msg_per_s", "W1 throughput, msg/s (log scale)", "w1-throughput", True),
            ("broker_cpu_us_per_msg", "W1 broker CPU µs per message (lower is better)",
             "w1-cpu", True)):
        fig, ax = plt.subplots(figsize=(10, 4.5))
        width = 0.8 / max(1, len(names))
        for i, b in enumerate(names):
            vals = [w1(b, ph, s, key) or 0 for ph, s in phases]
            ax.bar([x + i * width for x in range(len(phases))], vals, width,
                   label=LABEL[b], hatch="//" if b in OTHERS else None)
        ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(phases))])
        ax.set_xticklabels([f"{ph} {s} B" for ph, s in phases])
        if log:
            ax.set_yscale("log")
        ax.set_title(title + f" — {stamp}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        p = results / f"{stamp}-{fname}.png"
        fig.savefig(p, dpi=90)
        plt.close(fig)
        made.append(p)
    lat = [(b, get(rep, b, "W2") or get(rep, b, "other", "w2")) for b in names]
    lat = [(b, w) for b, w in lat if w and w.get("round_trip")]
    if lat:
        fig, ax = plt.subplots(figsize=(10, 4.5))
        qs = [("p50_us", "round trip p50"), ("p99_us", "round trip p99"),
              ("e2e_p50", "end-to-end p50"), ("e2e_p99", "end-to-end p99")]
        width = 0.8 / len(lat)
        for i, (b, w) in enumerate(lat):
            e = w.get("end_to_end") or {}
            vals = [w["round_trip"].get("p50_us"), w["round_trip"].get("p99_us"),
                    e.get("p50_us"), e.get("p99_us")]
            ax.bar([x + i * width for x in range(len(qs))], [v or 0 for v in vals], width,
                   label=LABEL[b], hatch="//" if b in OTHERS else None)
        ax.set_xticks([x + width * (len(lat) - 1) / 2 for x in range(len(qs))])
        ax.set_xticklabels([q[1] for q in qs])
        ax.set_yscale("log")
        ax.set_ylabel("µs")
        ax.set_title(f"W2 latency (lower is better) — {stamp}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        p = results / f"{stamp}-w2-latency.png"
        fig.savefig(p, dpi=90)
        plt.close(fig)
        made.append(p)
    return made
