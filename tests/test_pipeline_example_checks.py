"""examples/pipeline/run.py checks for pyspark and Java before it starts a broker or sends an
order, and says how to get each: a machine without them learns it in a second, not after a run.

pyspark is hidden by a package of that name on PYTHONPATH whose import fails (as a broken or
absent install does), Java by a JAVA_HOME without bin/java; TMPDIR is the test's own, so the
run's temp dir (made only once the checks pass) would show there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent
RUN: Final = ROOT / "examples" / "pipeline" / "run.py"
# The checks are imports and a PATH lookup; a broker start and 10 sends would take longer.
RUN_TIMEOUT_S: Final = 60.0


def test_pipeline_run_without_pyspark_and_java_says_what_to_install(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "pyspark"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("pyspark hidden by the test")\n')
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, PYTHONPATH=str(shadow.parent), JAVA_HOME=str(tmp_path / "no-java"))
    env["TMPDIR"] = str(tmp)
    done = subprocess.run(
        [sys.executable, str(RUN), "--orders", "10"],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert lines == [
        "examples/pipeline/run.py: pyspark is not installed: `make spark`, or "
        "`pip install -e '.[spark]'` in a clone",
        f"examples/pipeline/run.py: Java 17 is needed by Spark (JAVA_HOME={tmp_path / 'no-java'} "
        "has no bin/java): `make java`, or `apt-get install openjdk-17-jre-headless`",
    ], done.stderr
    assert done.stdout == ""
    assert list(tmp.iterdir()) == [], "a temp dir was made: the run started before checking"
