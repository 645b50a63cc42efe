"""A process and its descendants as ``/proc`` shows them: what a test needs to tell which
processes a command started, which of them are Spark drivers, and which are still alive."""

import os
from dataclasses import dataclass

JVM_MAIN = "org.apache.spark.deploy.SparkSubmit"
JVM_LAUNCHER = "org.apache.spark.launcher.Main"


def proc_stat(pid: int) -> tuple[int, str, str] | None:
    """(ppid, state, start time) of a live process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields[0], fields[19]


def is_alive(pid: int, start: str) -> bool:
    """Whether ``pid`` is still the process that started at ``start`` (zombies are dead)."""
    stat = proc_stat(pid)
    return stat is not None and stat[2] == start and stat[1] not in ("Z", "X")


@dataclass(frozen=True)
class ProcInfo:
    """A process seen under ``dagster dev``: start time (tells a reused pid), parent, command."""

    start: str
    ppid: int
    cmdline: str


def command_line(pid: int) -> str:
    """The command line of ``pid``, its arguments joined by spaces; ``?`` when it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def is_spark_driver(cmdline: str) -> bool:
    """A JVM running spark-submit (not the short-lived launcher that builds its command)."""
    return (
        os.path.basename(cmdline.split(" ")[0]) == "java"
        and JVM_MAIN in cmdline
        and JVM_LAUNCHER not in cmdline
    )


def descendants(root: int) -> dict[int, tuple[str, int]]:
    """PID -> (start time, ppid) of every live descendant of ``root``."""
    children: dict[int, list[int]] = {}
    stats: dict[int, tuple[str, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = proc_stat(int(entry))
        if stat is None:
            continue
        children.setdefault(stat[0], []).append(int(entry))
        stats[int(entry)] = (stat[2], stat[0])
    found: dict[int, tuple[str, int]] = {}
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found[child] = stats[child]
                todo.append(child)
    return found
