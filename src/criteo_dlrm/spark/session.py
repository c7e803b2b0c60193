"""The Spark session preprocessing runs on, and the checks that refuse it before any work.

Settings come from ``conf/base/spark.yml`` (Kedro's PySpark starter convention: read by a hook, every key a
Spark property), over this project's defaults: ``local[*]``, and the Python of this process for Spark's Python
workers (on a cluster, set ``spark.pyspark.python`` to the executors' interpreter).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from criteo_dlrm.common.errors import ConfigError, Fix, Remedy
from criteo_dlrm.common.locks import hold_until_exit

INSTALL_SPARK = 'pip install -e ".[spark]"'
# Spark 4 runs on Java 17 and 21 (its documentation's list).
JAVA_VERSIONS = (17, 21)
INSTALL_JAVA = "sudo apt-get install openjdk-17-jre-headless"

DEFAULT_SETTINGS = {
    "spark.master": "local[*]",
    "spark.app.name": "criteo-dlrm",
    "spark.log.level": "WARN",
    "spark.sql.debug.maxToStringFields": "100",  # the 26-feature plans, without a warning that they are long
}


def _with_defaults(settings: Mapping | None) -> dict[str, str]:
    if settings is not None and not isinstance(settings, Mapping):
        raise ConfigError(
            f"{SPARK_YML} holds a {type(settings).__name__}, not Spark properties: write each as `key: value` on "
            f"a line of its own (`spark.driver.memory: 4g`, not `- spark.driver.memory: 4g`); {BACK}.",
            fix=BACK,
        )
    merged = {**DEFAULT_SETTINGS, **{str(key): value for key, value in (settings or {}).items()}}
    if not sys.stderr.isatty():
        # Spark's console progress bar is carriage returns: in a log file or a pipe one line swallowing the next
        # log line. Progress there comes from the project's own lines.
        merged.setdefault("spark.ui.showConsoleProgress", "false")
    if "spark.remote" not in merged:  # a Spark Connect server runs its own Python
        merged.setdefault("spark.pyspark.python", os.environ.get("PYSPARK_PYTHON") or sys.executable)
        merged.setdefault("spark.pyspark.driver.python", sys.executable)
    return {key: str(value).lower() if isinstance(value, bool) else str(value) for key, value in merged.items()}


def java_version(java: str) -> int | None:
    """The major version ``java -version`` reports (None when it reports none)."""
    try:
        output = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60).stderr
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', output)
    if not found:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major  # "1.8.0": Java 8


_LOCAL = Fix(params={"preprocessing.engine": "local"})
# The way back from a Spark setting that cannot work.
BACK = Remedy(f"or preprocess on this machine's engine: `{_LOCAL}`", _LOCAL)


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def require_spark(settings: Mapping | None = None) -> None:
    """Refuse the Spark engine before any work when PySpark or (for a session that starts a JVM here) Java is
    missing, naming the install command."""
    local = "preprocessing.engine is spark (parameters_preprocessing.yml)"
    try:
        import pyspark  # noqa: F401
    except ImportError as error:
        raise ConfigError(
            f"{local}, but PySpark is not installed. Install the spark extra: `{INSTALL_SPARK}`; {BACK}.", fix=BACK
        ) from error
    if _with_defaults(settings).get("spark.remote", "").startswith("sc://"):
        return  # a Spark Connect server elsewhere: its JVM runs there (spark.remote: local[N] starts one here)
    home = os.environ.get("JAVA_HOME")
    if home and not (Path(home) / "bin" / "java").exists():  # Spark's launcher starts $JAVA_HOME/bin/java
        found = shutil.which("java")
        if found and (java_version(found) or 0) >= JAVA_VERSIONS[0]:
            there = Fix(environment={"JAVA_HOME": str(Path(os.path.realpath(found)).parent.parent)})
            instead = f"the Java on PATH is one: `{there}`"
        else:
            there = None
            instead = f"install one (Debian and Ubuntu: `{INSTALL_JAVA}`)"
        raise ConfigError(
            f"{local}, but JAVA_HOME is {home}, which holds no bin/java (Spark starts the JVM from it). Point "
            f"JAVA_HOME at a Java {' or '.join(map(str, JAVA_VERSIONS))} installation ({instead}); {BACK}.",
            fix=(there, BACK) if there else BACK,
        )
    java = _java()
    if java is None:
        raise ConfigError(
            f"{local}, but Java is not installed (Spark runs on a JVM: Java {' or '.join(map(str, JAVA_VERSIONS))}). "
            f"Install it (Debian and Ubuntu: `{INSTALL_JAVA}`) or set JAVA_HOME; {BACK}.",
            fix=BACK,
        )
    version = java_version(java)
    if version is not None and version < JAVA_VERSIONS[0]:
        raise ConfigError(
            f"{local}, but {java} is Java {version}; Spark 4 needs Java {' or '.join(map(str, JAVA_VERSIONS))}. "
            f"Install one (Debian and Ubuntu: `{INSTALL_JAVA}`) and point JAVA_HOME at it; {BACK}.",
            fix=BACK,
        )


SPARK_YML = "conf/base/spark.yml (conf/local/spark.yml or --env's overrides it)"
_MASTER = re.compile(
    r"local(\[(\*|\d+)(,\d+)?\])?|local-cluster\[\d+,\d+,\d+\]|spark://[^/]+|yarn|k8s://\S+|mesos://\S+"
)
_SIZE = re.compile(r"(\d+)\s*([kmgtp]?)b?", re.IGNORECASE)
# Spark refuses a driver (or an executor) with less memory than this: 450 MB of reserved memory and some room.
MEMORY_AT_LEAST = 471_859_200


def check_spark_settings(settings: Mapping | None, timeout: float = 5.0) -> None:
    """Refuse, in seconds and naming spark.yml's key and the fix, the settings Spark would fail on after minutes of
    JVM output: a master that is not a master URL, a standalone master nothing answers at, a driver or executor
    memory too small or not a size."""
    merged = _with_defaults(settings)
    if "spark.remote" in merged:
        reuse = merged.get("spark.local.connect.reuse", os.environ.get("SPARK_LOCAL_CONNECT_REUSE", ""))
        _check_remote(merged["spark.remote"], timeout, reuse=reuse.lower() in ("1", "true"))
        return
    master = merged["spark.master"]
    if not _MASTER.fullmatch(master):
        raise ConfigError(
            f"{SPARK_YML}: spark.master {master!r} is not a Spark master URL (local[*], local[4], spark://host:7077, "
            f"yarn, k8s://https://host:443). Fix the key, {BACK}.",
            fix=BACK,
        )
    if master.startswith("spark://"):
        for address in master.removeprefix("spark://").split(","):
            host, _, port = address.rpartition(":")
            try:
                socket.create_connection((host or address, int(port or 7077)), timeout=timeout).close()
            except (OSError, ValueError) as error:
                raise ConfigError(
                    f"{SPARK_YML}: nothing answers at spark.master {master} ({address}: {error}). Start the Spark "
                    f"master there or point spark.master at one that runs, {BACK}.",
                    fix=BACK,
                ) from None
    for key in ("spark.driver.memory", "spark.executor.memory"):
        if key not in merged:
            continue
        size = _SIZE.fullmatch(merged[key].strip())
        factor = {"": 2**20, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50}  # Spark's unit: MiB
        if size is None or int(size.group(1)) * factor[size.group(2).lower()] < MEMORY_AT_LEAST:
            raise ConfigError(
                f"{SPARK_YML}: {key} {merged[key]!r} is {'not a size' if size is None else 'too small'}: Spark needs "
                f"at least {MEMORY_AT_LEAST // 2**20} MB (e.g. 2g). Fix the key, {BACK}.",
                fix=BACK,
            )


# Spark Connect's port: where an sc:// address without one is reached, and where PySpark's client reaches a server it
# started here (spark.remote: local[N]).
CONNECT_PORT = 15002


def _check_remote(remote: str, timeout: float, reuse: bool = False) -> None:
    """A Spark Connect address (``sc://host[:port][/;params]``) that nothing answers at, refused in seconds (Spark
    Connect's client was still retrying after 90 s); a local one (``local[N]``) whose port another server holds
    (unless ``reuse``: PySpark's opt-in to share one local server, ``spark.local.connect.reuse``)."""
    if not remote.startswith("sc://"):
        if re.fullmatch(r"local(\[(\*|\d+)\])?", remote):
            if not reuse:
                _check_local_connect_port(remote, timeout)
            return
        raise ConfigError(
            f"{SPARK_YML}: spark.remote {remote!r} is not a Spark Connect address (sc://host:{CONNECT_PORT}, or local[*] for "
            f"a server on this machine). Fix the key, {BACK}.",
            fix=BACK,
        )
    address = remote.removeprefix("sc://").split("/", 1)[0].split(";", 1)[0]
    host, _, port = address.rpartition(":") if ":" in address else (address, "", "")
    try:
        socket.create_connection((host, int(port or CONNECT_PORT)), timeout=timeout).close()
    except (OSError, ValueError) as error:
        raise ConfigError(
            f"{SPARK_YML}: nothing answers at spark.remote {remote} ({address}: {error}). Start the Spark Connect "
            f"server there or point spark.remote at one that runs, {BACK}.",
            fix=BACK,
        ) from None


def _check_local_connect_port(remote: str, timeout: float) -> None:
    """``spark.remote: local[N]`` starts a Spark Connect server in this process on PySpark's fixed port: with the
    port taken (another run's server) Spark failed after its JVM started, in a long Py4J trace naming neither.

    The port is this process's from the check on: it holds a lock on it until it exits (the check alone let two
    runs started at once both find the port free), and a run of this project that holds it is named."""
    if "SPARK_LOCAL_REMOTE" in os.environ or "SPARK_TESTING" in os.environ:  # as PySpark tells them
        return  # this process's own server already listens there (or PySpark's test mode, on a port of its own)
    lock = Path(tempfile.gettempdir()) / f"criteo_dlrm_spark_connect_server_{CONNECT_PORT}"
    try:
        holder = hold_until_exit(lock, f"the local Spark Connect server's port {CONNECT_PORT}")
    except OSError:  # another user's lock file (a killed run's, on a shared machine): the port's own check below
        holder = None
    if holder is not None:
        raise _port_taken(remote, f"another run holds that port: {holder}")
    try:
        socket.create_connection(("localhost", CONNECT_PORT), timeout=min(timeout, 1.0)).close()
    except OSError:
        return  # nothing listens: the server can start
    raise _port_taken(
        remote,
        "another process already listens there (most likely another run's local Spark Connect server: "
        f"`ss -ltnp 'sport = :{CONNECT_PORT}'` names it)",
    )


def _port_taken(remote: str, by: str) -> ConfigError:
    """The refusal of a local Connect server (``spark.remote: local[N]``) whose port ``by`` holds."""
    return ConfigError(
        f"{SPARK_YML}: spark.remote {remote!r} starts a Spark Connect server on this machine, on PySpark's fixed port "
        f"{CONNECT_PORT}, and {by}. Run one such job at a time on a machine, or leave spark.remote out to run this "
        f"one on Spark without Connect (spark.master: {remote}), {BACK}.",
        fix=BACK,
    )


def spark_session(settings: Mapping | None = None):
    """The Spark session: the one already started (``settings`` None), or one with ``settings`` (spark.yml's keys,
    over ``DEFAULT_SETTINGS``; ``spark.remote: sc://...`` connects to a Spark Connect server instead)."""
    require_spark(settings)
    check_spark_settings(settings)
    from pyspark.sql import SparkSession

    if settings is None and (active := SparkSession.getActiveSession()) is not None:
        return active
    merged = _with_defaults(settings)
    _name_the_workers_python(merged)
    builder = SparkSession.builder
    for key, value in merged.items():
        if key == "spark.remote":
            builder = builder.remote(value)
        elif not (key == "spark.master" and "spark.remote" in (settings or {})):
            builder = builder.config(key, value)
    return builder.getOrCreate()


def _name_the_workers_python(merged: Mapping[str, str]) -> None:
    """Make Spark's Python workers run ``spark.pyspark.python`` (this process's Python by default).

    PySpark starts its workers with the ``PYSPARK_PYTHON`` of the process that creates the session, else
    ``python3`` from the ``PATH``; the ``spark.pyspark.python`` property alone reaches only ``spark-submit``. A
    job that runs the environment's ``kedro`` by its path, without activating it (a batch script), had its
    workers start another Python, without criteo_dlrm or pyarrow. A Spark Connect server started here
    (``spark.remote: local[N]``) inherits the variable too; a remote one (``sc://``) runs its own Python.
    """
    if "spark.remote" not in merged:
        os.environ["PYSPARK_PYTHON"] = merged["spark.pyspark.python"]
    elif merged["spark.remote"].startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def master(session) -> str:
    """Where the session's executors are (its master, or the Spark Connect server)."""
    try:
        return session.sparkContext.master
    except Exception:  # Spark Connect has no SparkContext
        return session.conf.get("spark.remote", "Spark Connect")
