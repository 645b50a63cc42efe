"""A ``JAVA_HOME`` that records every JVM launch, for the tests that promise no JVM starts
(Spark's launcher runs ``$JAVA_HOME/bin/java``, so a JVM started anywhere in a process tree
given it leaves a line behind)."""

import os
import shutil
from pathlib import Path


def java_shim(tmp_path: Path) -> tuple[Path, Path]:
    """A JAVA_HOME whose bin/java appends its arguments to a log, then runs the real java."""
    real = os.path.realpath(
        os.path.join(os.environ["JAVA_HOME"], "bin", "java")
        if os.environ.get("JAVA_HOME")
        else shutil.which("java") or "java"
    )
    launches = tmp_path / "java-launches.log"
    home = tmp_path / "java-shim"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f'#!/bin/sh\necho "$*" >> "{launches}"\nexec "{real}" "$@"\n')
    java.chmod(0o755)
    return home, launches


def shim_env(home: Path, java_home: Path) -> dict[str, str]:
    """The environment of a command on the demo home ``home`` whose JVMs start from
    ``java_home`` (a :func:`java_shim`), without colours."""
    return {
        **os.environ,
        "WATERMARK_HOME": str(home),
        "DAGSTER_HOME": str(home / "dagster"),
        "JAVA_HOME": str(java_home),
        "NO_COLOR": "1",
    }
