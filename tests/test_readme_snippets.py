"""Every ```python and ```sh snippet of README.md, run as written against a real `tidemq dev`.

The snippets are taken from the Markdown itself, so the README cannot drift from what works. One
`tidemq dev` (name server and broker on free loopback ports, data in `<tmp>/data`) serves them
all, in README order (the quick start creates the topic later snippets use). The default name
server address `127.0.0.1:9876` in a snippet is replaced by that server's address, and the CLI
reads it from TIDEMQ_NAMESRV_ADDR, so a snippet runs exactly as a user types it against
`make run`. Shell snippets run under `bash -e` in a directory where `data/` is the dev server's
data and `conf/`, `examples/` and `scripts/` are the repository's.

A snippet that cannot run here (it serves in the foreground, needs a Spark cluster, or takes
minutes) is preceded in the README by an HTML comment, invisible on GitHub, that says why:

    <!-- readme-test: skip: starts servers in the foreground on fixed ports -->

A skip must give a reason, and the tests that cover what the snippet does are named in it.
A snippet that starts servers of its own on RocketMQ's fixed ports (scripts/cluster-2x2.sh)
says so instead, and runs with NAMESRV_PORT and BROKER_PORT_BASE set to free ports and the CLI
pointed at that name server:

    <!-- readme-test: own-ports -->
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

from tidemq import Admin
from tidemq.errors import QueueError
from tidemq.testing import eventually_async
from tidemq.testing.processes import ServerProcess, free_broker_port, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT: Final = Path(__file__).resolve().parent.parent
README: Final = ROOT / "README.md"
DEFAULT_NAMESRV: Final = "127.0.0.1:9876"
RUN_LANGUAGES: Final = ("python", "sh")
SKIP_MARK: Final = re.compile(r"<!--\s*readme-test:\s*skip:\s*(?P<reason>\S.*?)\s*-->")
OWN_PORTS_MARK: Final = re.compile(r"<!--\s*readme-test:\s*own-ports\s*-->")
# scripts/cluster-2x2.sh's brokers listen on BROKER_PORT_BASE + 0, 10, 20 and 30, each with its
# port - 2 (VIP) and port + 1 (HA): this many ports from BROKER_PORT_BASE - 2 must be free.
CLUSTER_PORT_SPAN: Final = 34
FENCE: Final = re.compile(r"^```(?P<language>\S*)\s*$")
# One snippet's budget: the quick start's consumer listens for 5 s; a loaded 2-core machine.
SNIPPET_TIMEOUT_S: Final = 60.0
# Until the dev broker has registered with its name server (1st registration at start).
REGISTER_TIMEOUT_S: Final = 30.0


@dataclass(frozen=True)
class Snippet:
    language: str
    code: str
    line: int  # 1-based line of the opening fence
    heading: str
    skip_reason: str | None
    own_ports: bool = False

    @property
    def name(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.heading.lower()).strip("-")
        return f"L{self.line}-{slug}-{self.language}"


def extract_snippets(markdown: str) -> list[Snippet]:
    """The ```python and ```sh blocks of `markdown`, each with the skip comment before it."""
    snippets: list[Snippet] = []
    lines = markdown.splitlines()
    heading, previous, index = "top", "", 0
    while index < len(lines):
        line = lines[index]
        fence = FENCE.match(line)
        if fence is None:
            if line.startswith("#"):
                heading = line.lstrip("#").strip()
            if line.strip():
                previous = line
            index += 1
            continue
        end = index + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        language = fence["language"]
        if language in RUN_LANGUAGES:
            mark = SKIP_MARK.search(previous)
            code = "\n".join(lines[index + 1 : end]) + "\n"
            reason = mark["reason"] if mark else None
            own_ports = OWN_PORTS_MARK.search(previous) is not None
            snippets.append(Snippet(language, code, index + 1, heading, reason, own_ports))
        previous, index = "", end + 1
    return snippets


SNIPPETS: Final = extract_snippets(README.read_text())


@dataclass(frozen=True)
class Dev:
    namesrv_addr: str
    workdir: Path


async def _start_dev(root: Path) -> tuple[ServerProcess, str]:
    namesrv_port, broker_port = free_port(), free_broker_port()
    dev = ServerProcess(
        name="dev",
        args=[
            *("dev", "--namesrv-port", str(namesrv_port), "--broker-port", str(broker_port)),
            *("--data-dir", str(root / "data")),
        ],
        port=broker_port,  # the broker starts after the name server
        log_path=root / "dev.log",
    )
    await dev.start()
    namesrv_addr = f"127.0.0.1:{namesrv_port}"

    async def registered() -> bool:  # a snippet's first command needs the broker's route
        try:
            async with Admin(namesrv_addr, timeout_ms=2_000) as admin:
                return bool((await admin.cluster_info()).broker_addr_table)
        except QueueError:
            return False

    try:
        await eventually_async(registered, REGISTER_TIMEOUT_S, what="the dev broker registered")
    except BaseException:
        dev.kill()
        raise
    return dev, namesrv_addr


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dev]:
    root = tmp_path_factory.mktemp("readme")
    for name in ("conf", "examples", "scripts"):
        (root / name).symlink_to(ROOT / name)
    process, namesrv_addr = asyncio.run(_start_dev(root))
    try:
        yield Dev(namesrv_addr, root)
    finally:
        code = asyncio.run(process.stop())
        assert code == 0, process.log_tail()


def _port_span_is_free(first: int, count: int) -> bool:
    for port in range(first, first + count):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def _cluster_ports() -> tuple[int, int]:
    """NAMESRV_PORT and a BROKER_PORT_BASE whose whole span of broker ports is free."""
    for _ in range(100):
        base = free_port()
        in_range = base - 2 > 1024 and base + CLUSTER_PORT_SPAN < 65536
        if in_range and _port_span_is_free(base - 2, CLUSTER_PORT_SPAN):
            namesrv_port = free_port()
            if not base - 2 <= namesrv_port < base - 2 + CLUSTER_PORT_SPAN:
                return namesrv_port, base
    raise RuntimeError("no free span of ports for scripts/cluster-2x2.sh")


def _environment(snippet: Snippet, namesrv_addr: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["TIDEMQ_NAMESRV_ADDR"] = namesrv_addr
    env.pop("NAMESRV_ADDR", None)
    if snippet.own_ports:
        namesrv_port, broker_base = _cluster_ports()
        env["NAMESRV_PORT"], env["BROKER_PORT_BASE"] = str(namesrv_port), str(broker_base)
        env["TIDEMQ_NAMESRV_ADDR"] = f"127.0.0.1:{namesrv_port}"
    return env


def test_every_snippet_is_found_and_every_skip_says_why() -> None:
    assert {s.language for s in SNIPPETS} == set(RUN_LANGUAGES)
    assert len(SNIPPETS) >= 10, [s.name for s in SNIPPETS]
    for snippet in SNIPPETS:
        assert snippet.skip_reason is None or len(snippet.skip_reason) > 20, snippet.name


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.name for s in SNIPPETS])
def test_readme_snippet_runs_as_written(snippet: Snippet, dev: Dev) -> None:
    if snippet.skip_reason is not None:
        pytest.skip(snippet.skip_reason)
    code = snippet.code.replace(DEFAULT_NAMESRV, dev.namesrv_addr)
    if snippet.language == "python":
        path = dev.workdir / f"snippet_{snippet.line}.py"
        path.write_text(code)
        command = [sys.executable, str(path)]
    else:
        command = ["bash", "-e", "-o", "pipefail", "-c", code]
    # A session of its own, killed whole afterwards: nothing a snippet starts outlives it.
    process = subprocess.Popen(
        command,
        cwd=dev.workdir,
        env=_environment(snippet, dev.namesrv_addr),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=SNIPPET_TIMEOUT_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == 0, (
        f"README.md line {snippet.line} exited {process.returncode}:\n{code}\n"
        f"--- stdout\n{stdout}\n--- stderr\n{stderr}"
    )
