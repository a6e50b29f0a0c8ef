"""The money transfer, end to end, with service A killed at random points.

    python examples/transfer/run.py --transfers 2000 [--seed 1] [--kills 8]

1. starts `tidemq dev` (name server + broker in one process) on free ports in a temp dir, with a
   short check-back (transactionCheckInterval=200 ms, transactionTimeOut=1000 ms);
2. starts service B (service_b.py), which credits b.db once per transfer id;
3. runs service A (service_a.py) again and again: each run but the last stops at a kill point
   drawn from the seed — after the half send (before the local commit), after the local commit
   (before END_TRANSACTION) or after END_TRANSACTION — and is killed there with SIGKILL; the next
   run resumes from a.db. The broker's check-backs, answered from a.db by whichever A is alive,
   settle what the dead ones left open;
4. waits until B has credited every transfer A debited, prints both totals, and exits 0 iff
   they balance (A's debits == B's credits, transfer by transfer count and amount).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from ledger import OPENING_BALANCE, TOPIC, totals

HERE = Path(__file__).resolve().parent
TIDEMQ = [sys.executable, "-m", "tidemq.cli.main"]
POINTS = ("half_sent", "local_committed", "end_sent")
BROKER_SETTINGS = {
    "vipChannelEnabled": "false",
    "transactionCheckInterval": "200",
    "transactionTimeOut": "1000",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port}")


def read_until(proc: subprocess.Popen[str], prefix: str, deadline: float) -> str:
    """The first stdout line of `proc` starting with `prefix` (other lines are skipped)."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
                continue
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{proc.args[2]} exited ({proc.wait()}) before {prefix!r}")
            if line.startswith(prefix):
                return line.strip()
    raise TimeoutError(f"no {prefix!r} from {proc.args[2]}")


def kill_plan(seed: int, transfers: int, kills: int) -> list[tuple[int, str]]:
    """(transfer number, kill point) pairs in order, drawn from the seed."""
    rng = random.Random(seed)
    numbers = sorted(rng.sample(range(transfers), min(kills, transfers)))
    return [(number, rng.choice(POINTS)) for number in numbers]


@contextlib.contextmanager
def started(args: list[str], log_path: Path, **kwargs: object) -> Iterator[subprocess.Popen[str]]:
    with log_path.open("w") as log:
        proc = subprocess.Popen(args, stderr=log, text=True, **kwargs)  # type: ignore[call-overload]
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def service_a(namesrv: str, root: Path, args: argparse.Namespace, run: int) -> list[str]:
    return [
        sys.executable,
        str(HERE / "service_a.py"),
        "--namesrv",
        namesrv,
        "--db",
        str(root / "a.db"),
        "--transfers",
        str(args.transfers),
        "--seed",
        str(args.seed),
        "--incarnation",
        str(run),
    ]


def balanced(root: Path, transfers: int) -> tuple[bool, tuple[int, int, int], tuple[int, int, int]]:
    debits = totals(root / "a.db", "debit")
    credits = totals(root / "b.db", "credit")
    ok = (
        debits[0] == transfers
        and debits[:2] == credits[:2]
        and debits[2] + credits[2] == OPENING_BALANCE
    )
    return ok, debits, credits


def run(args: argparse.Namespace, root: Path) -> bool:
    deadline = time.monotonic() + args.timeout_s
    namesrv_port, broker_port = free_port(), free_port()
    namesrv = f"127.0.0.1:{namesrv_port}"
    dev_args = [*TIDEMQ, "dev", "--namesrv-port", str(namesrv_port)]
    dev_args += ["--broker-port", str(broker_port), "--data-dir", str(root / "data")]
    for key, value in BROKER_SETTINGS.items():
        dev_args += ["--set", f"{key}={value}"]
    with started(dev_args, root / "dev.log") as dev:
        wait_port(broker_port, deadline)
        create = [*TIDEMQ, "topic", "create", "-n", namesrv, "-t", TOPIC, "-q", "4"]
        for _ in range(50):  # until the broker has registered with the name server
            if subprocess.run(create, capture_output=True, check=False).returncode == 0:
                break
            time.sleep(0.1)
        b_args = [sys.executable, str(HERE / "service_b.py"), "--namesrv", namesrv]
        b_args += ["--db", str(root / "b.db")]
        with started(b_args, root / "b.log", stdout=subprocess.PIPE) as b:
            read_until(b, "READY", deadline)
            plan = kill_plan(args.seed, args.transfers, args.kills)
            for run_number, (number, point) in enumerate(plan):
                a_args = service_a(namesrv, root, args, run_number)
                a_args += ["--pause-at", f"{number}:{point}"]
                log_path = root / f"a-{run_number}.log"
                with started(a_args, log_path, stdout=subprocess.PIPE) as a:
                    read_until(a, "PAUSED", deadline)
                    a.send_signal(signal.SIGKILL)
                    a.wait()
                print(f"killed service A at transfer {number} ({point.replace('_', ' ')})")
            a_args = service_a(namesrv, root, args, len(plan))
            with started(a_args, root / "a-last.log", stdout=subprocess.PIPE) as a:
                read_until(a, "DONE", deadline)
                ok, debits, credits = balanced(root, args.transfers)
                while not ok and time.monotonic() < deadline:
                    time.sleep(0.2)
                    ok, debits, credits = balanced(root, args.transfers)
        assert dev.poll() is None, "tidemq dev died"
    for name, verb, (count, amount, balance) in (
        ("A", "debited ", debits),
        ("B", "credited", credits),
    ):
        print(f"service {name}: {verb} {amount:>10} cents in {count} transfers, balance {balance}")
    print(
        f"{'balanced' if ok else 'NOT BALANCED'}: A + B = {debits[2] + credits[2]} "
        f"(opening {OPENING_BALANCE}), {args.transfers} transfers planned"
    )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transfers", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kills", type=int, default=None, help="default: transfers / 250, >= 3")
    parser.add_argument("--timeout-s", type=float, default=300.0)
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, dbs)")
    args = parser.parse_args()
    if args.kills is None:
        args.kills = max(3, args.transfers // 250)
    root = Path(tempfile.mkdtemp(prefix="tidemq-transfer-"))
    try:
        ok = run(args, root)
    finally:
        if args.keep:
            print(f"logs and databases in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
