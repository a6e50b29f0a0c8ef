"""Replication benchmarks (issue 13): produce side by side, replication lag, slave catch-up.

    sidebyside  pipelined and batched produce (1 KiB) with a SYNC_MASTER + slave pair (SYNC_FLUSH
                on both, then ASYNC_FLUSH on both), one broker with SYNC_FLUSH (the reference,
                measured in the same run) and NATS JetStream R3 (three nats-server processes);
                see sidebyside/replication.py. Target: SYNC_MASTER pipelined >= 0.8x reference.
    lag         a master (`--lag-role`, ASYNC_MASTER by default) and a slave; an open-loop
                producer sends `--lag-rate` msg/s of 1 KiB for `--lag-seconds`, in batches of
                `--lag-batch` (10: see LAG_BATCH_DEFAULT; 1 = a send per message). Per message:
                (readable on the slave) - (the producer got the master's ack). "Readable" is
                measured two ways (`--lag-method`): `pull` - a reader process long-polls every
                queue of the topic on the slave by queue offset and stamps each message on
                arrival; `offset` - a reader process polls the slave's runtime info
                (commitLogMaxOffset) back to back and a message is readable at the first poll
                past its commit-log offset (from its offsetMsgId). Both stamps are taken on
                arrival of the answer, so they are late by up to one pull/poll round trip.
                A negative lag means the slave had it before the producer saw the ack (always
                the case with SYNC_MASTER). The same readers pointed at the master (`pull@master`,
                `offset@master`) give the measurement's own floor in the same run: the delay of a
                reader on a busy 2-core machine, with no replication in the path. Target: p99 <
                10 ms.
    catchup     `--catchup-gib` GiB of `--catchup-body`-byte messages written into a store, a
                master (ASYNC_MASTER with an HA secret, no slave) started on it, then an empty
                slave started: seconds until the slave's commitLogMaxOffset equals the master's,
                as MiB/s from the slave's first replicated byte, from its port accepting and
                from its spawn; then both commit logs compared byte for byte. Target: >= 100
                MiB/s. The master's log is in the page cache (just written): this is the
                network + slave append + dispatch rate, not a cold-disk read.

Every broker, name server and NATS node is its own process on 127.0.0.1 with data in a temp dir,
stopped by pid at the end. Results are printed and appended to benchmarks/RESULTS.md.

Usage: python benchmarks/bench_replication.py [all|sidebyside|lag|catchup] [--runs 3]
           [--measure-s 3] [--quick] [--no-append] [--systems "sync_master,nats"]
           [--lag-rate 10000] [--lag-seconds 20] [--lag-batch 10]
           [--lag-method pull,offset,pull@master,offset@master] [--lag-role ASYNC_MASTER]
           [--catchup-gib 1] [--catchup-body 1024,16384] [--no-uvloop]

`all` takes about 5 min on 2 cores. NATS rows need `nats-server` (`apt-get install nats-server`,
or `make bench-deps`) and nats-py (the `bench` extra); without the binary they are skipped and
named.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import functools
import logging
import multiprocessing
import os
import platform
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sidebyside import replication, servers
from sidebyside.common import Options, cpu_foreign_cores, cpu_snapshot, payload, percentile

log = logging.getLogger("bench")
RESULTS: Final = Path(__file__).resolve().parent / "RESULTS.md"

LAG_QUEUES: Final = 4  # queues of the lag topic (as the side-by-side suite's topics)
# The pull reader follows queue 0 only: a Python reader decoding all 10k msg/s falls behind on a
# 2-core machine shared with the producer and both brokers, and then measures itself. Every queue
# replicates through the same stream, so a quarter of the messages is a fair sample.
LAG_PULLED_QUEUES: Final = (0,)
# Between two runtime-info polls: back to back, the poller takes CPU the brokers need.
LAG_POLL_S: Final = 0.001
LAG_QUIET_S: Final = 1.0  # after the producer's end, the pull reader stops after this long idle
LAG_PULL_MAX: Final = 32  # messages per pull from the slave
LAG_SUSPEND_MS: Final = 1000  # long-poll hold on the slave
# Ten messages per SEND_BATCH_MESSAGE: one Python producer does not reach 10k single sends a
# second on a 2-core machine that also runs both brokers and the reader (it measured 2-3k/s).
LAG_BATCH_DEFAULT: Final = 10
LAG_WINDOW_MAX: Final = 4096  # sends in flight at most; past it the producer falls behind
LAG_TICK_S: Final = 0.001  # the open-loop producer sends what is due every tick
LAG_WARMUP_PER_QUEUE: Final = 50
LAG_DRAIN_S: Final = 15.0  # after the last ack, how long the reader may take to see the rest
CATCHUP_MIB_S_MIN: Final = 4.0  # slower than this is a failure (a stall), not a figure
CATCHUP_POLL_S: Final = 0.02
COMPARE_CHUNK: Final = 64 * 1024 * 1024


# -- lag: the reader process --------------------------------------------------------------------


class _Arrivals:
    """What the reader saw: (queue, queue offset, arrival ns) per pulled message; an event for
    'every pulled queue answered' (the topic is on the slave) and one set at every arrival."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int, int]] = []
        self.queues: set[int] = set()
        self.every_queue = asyncio.Event()
        self.arrived = asyncio.Event()

    def add(self, queue_id: int, offsets: list[int], arrived_ns: int) -> None:
        self.seen.extend((queue_id, offset, arrived_ns) for offset in offsets)
        self.queues.add(queue_id)
        if len(self.queues) == len(LAG_PULLED_QUEUES):
            self.every_queue.set()
        self.arrived.set()

    async def quiet(self, idle_s: float, limit_s: float) -> None:
        """Until nothing arrived for `idle_s` (or `limit_s` passed)."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), idle_s)
            except TimeoutError:
                return


async def _pull_queue(admin: Any, spec: dict[str, Any], queue_id: int, out: _Arrivals) -> None:
    """Long-poll one queue on the slave from offset 0, for ever (the caller cancels)."""
    from tidemq.client.pull_answer import decode_pull_response
    from tidemq.protocol import message as pm
    from tidemq.protocol.bodies import MessageQueue
    from tidemq.protocol.codes import RequestCode
    from tidemq.protocol.frame import RemotingCommand
    from tidemq.protocol.headers import PullMessageRequestHeader, PullSysFlag

    mq = MessageQueue(topic=spec["topic"], broker_name=spec["broker"], queue_id=queue_id)
    offset = 0
    tags = pm.parse_tag_expression("*")
    while True:
        header = PullMessageRequestHeader(
            consumer_group="bench_lag",
            topic=spec["topic"],
            queue_id=queue_id,
            queue_offset=offset,
            max_msg_nums=LAG_PULL_MAX,
            sys_flag=int(PullSysFlag.SUBSCRIPTION | PullSysFlag.SUSPEND),
            commit_offset=0,
            suspend_timeout_millis=LAG_SUSPEND_MS,
            subscription="*",
            sub_version=0,
            expression_type=pm.EXPRESSION_TYPE_TAG,
        )
        cmd = RemotingCommand(code=RequestCode.PULL_MESSAGE, ext_fields=header.to_fields())
        try:
            response = await admin.instance.remoting.invoke(
                spec["slave"], cmd, LAG_SUSPEND_MS + 5000
            )
            arrived = time.monotonic_ns()
            result = decode_pull_response(
                response, mq, tags, requested_offset=offset, max_nums=LAG_PULL_MAX
            )
        except Exception:  # the topic is not on the slave yet, or a hiccup: try again
            result = None
        if result is None:
            await asyncio.sleep(0.01)
            continue
        if result.messages:
            out.add(queue_id, [m.queue_offset for m in result.messages], arrived)
        offset = result.next_begin_offset


async def _poll_offsets(admin: Any, slave: str, out: list[tuple[int, int]]) -> None:
    """Runtime info of the slave every LAG_POLL_S, for ever (the caller cancels); appends
    (arrival ns, commitLogMaxOffset) at every change."""
    last = -1
    while True:
        try:
            info = await replication.runtime_info(admin, slave)
        except Exception:
            await asyncio.sleep(0.01)
            continue
        arrived = time.monotonic_ns()
        offset = int(info["commitLogMaxOffset"])
        if offset != last:
            out.append((arrived, offset))
            last = offset
        await asyncio.sleep(LAG_POLL_S)


async def _read(method: str, spec: dict[str, Any], ready: Any, stop: Any) -> list[Any]:
    """The reader's work: ready once the slave serves the topic; after `stop`, the pull reader
    waits up to LAG_DRAIN_S for the rest, the offset poller polls one more second."""
    from tidemq import Admin

    loop = asyncio.get_running_loop()
    arrivals = _Arrivals()
    offsets: list[tuple[int, int]] = []
    async with Admin(spec["namesrv"]) as admin:
        if method == "offset":
            tasks = [asyncio.create_task(_poll_offsets(admin, spec["slave"], offsets))]
        else:
            tasks = [
                asyncio.create_task(_pull_queue(admin, spec, q, arrivals))
                for q in LAG_PULLED_QUEUES
            ]
            await asyncio.wait_for(arrivals.every_queue.wait(), 60)
        ready.set()
        try:
            await loop.run_in_executor(None, stop.wait, spec["timeout_s"])
            if method == "offset":
                await asyncio.sleep(1.0)
            else:
                await arrivals.quiet(LAG_QUIET_S, LAG_DRAIN_S)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return offsets if method == "offset" else arrivals.seen


def _lag_reader(method: str, spec: dict[str, Any], ready: Any, stop: Any, results: Any) -> None:
    """The reader process's entry point."""
    from tidemq.remoting.loop import install_uvloop

    install_uvloop()
    try:
        results.put(asyncio.run(_read(method, spec, ready, stop)))
    except Exception as exc:
        results.put(f"reader: {type(exc).__name__}: {exc!r}")
    results.close()
    results.join_thread()
    os._exit(0)


# -- lag: the producer --------------------------------------------------------------------------


async def _paced_sends(
    producer: Any, topic: str, rate: int, seconds: float, batch: int
) -> dict[str, Any]:
    """Open loop: message i is due at start + i / rate, sent alone (batch 1: send_nowait) or in
    SEND_BATCH_MESSAGE requests of `batch`. Returns the acks as (sent ns, acked ns, queue id,
    queue offset, commit-log offset), one per message, and the shortfalls."""
    from tidemq import Message

    body = payload(1024)
    acks: list[tuple[int, int, int, int, int]] = []
    errors: list[str] = []
    pending: set[Any] = set()
    total = int(rate * seconds) // batch * batch
    behind = 0  # ticks where the window was full (the producer fell behind the rate)

    def done(sent_ns: int, future: Any) -> None:
        pending.discard(future)
        if future.cancelled() or future.exception() is not None:
            errors.append(repr(future.exception())[:200] if not future.cancelled() else "cancelled")
            return
        acked, result = time.monotonic_ns(), future.result()
        queue = result.message_queue.queue_id
        for index, msg_id in enumerate(result.offset_msg_id.split(",")):
            acks.append((sent_ns, acked, queue, result.queue_offset + index, int(msg_id[-16:], 16)))

    def send() -> Any:
        if batch == 1:
            return producer.send_nowait(Message(topic, body))
        return asyncio.ensure_future(producer.send_batch([Message(topic, body)] * batch))

    start = time.monotonic()
    sent = 0
    while sent < total:
        due = min(total, int((time.monotonic() - start) * rate) + 1)
        while sent < due:
            if len(pending) * batch >= LAG_WINDOW_MAX:
                behind += 1
                break
            future = send()
            pending.add(future)
            future.add_done_callback(functools.partial(done, time.monotonic_ns()))
            sent += batch
        await asyncio.sleep(LAG_TICK_S)
    await asyncio.gather(*list(pending), return_exceptions=True)
    elapsed = time.monotonic() - start
    return {"acks": acks, "errors": errors, "behind_ticks": behind, "rate_achieved": sent / elapsed}


def _lags(method: str, acks: list[Any], seen: list[Any]) -> tuple[list[float], int]:
    """Per acknowledged message, readable-on-slave minus acked, in ms; and how many never were."""
    lags: list[float] = []
    missing = 0
    if method == "pull":
        arrived = {(q, o): t for q, o, t in seen}
        for _, acked, queue, offset, _ in acks:
            if queue not in LAG_PULLED_QUEUES:
                continue
            t = arrived.get((queue, offset))
            if t is None:
                missing += 1
            else:
                lags.append((t - acked) / 1e6)
        return lags, missing
    times = [t for t, _ in seen]
    offsets = [o for _, o in seen]
    for _, acked, _, _, physical in acks:
        index = bisect.bisect_right(offsets, physical)  # first poll whose max > the record start
        if index == len(offsets):
            missing += 1
        else:
            lags.append((times[index] - acked) / 1e6)
    return lags, missing


async def _lag_run(args: argparse.Namespace, method: str, group: servers.Group) -> dict[str, Any]:
    from tidemq import Admin, Message, Producer

    async with Admin(group.namesrv) as admin:
        await replication.wait_in_sync(admin, group)
        topic = f"BenchLag_{method.replace('@', '_')}_{int(time.time()) % 100_000}"
        await admin.create_topic(
            topic,
            broker_addr=group.master.address,
            read_queue_nums=LAG_QUEUES,
            write_queue_nums=LAG_QUEUES,
        )
    producer = Producer("bench_lag_producer", group.namesrv)
    await producer.start()
    try:
        for _ in range(LAG_WARMUP_PER_QUEUE * LAG_QUEUES):
            await producer.send(Message(topic, b"warm-up"))
        how, _, target = method.partition("@")
        spec = {
            "namesrv": group.namesrv,
            "slave": group.master.address if target == "master" else group.slaves[0].address,
            "topic": topic,
            "broker": "bench-a",
            "timeout_s": args.lag_seconds * 3 + 60,  # the stop event comes long before
        }
        return {"method": method, **await _with_reader(how, spec, producer, topic, args)}
    finally:
        await producer.shutdown()


async def _with_reader(
    method: str, spec: dict[str, Any], producer: Any, topic: str, args: argparse.Namespace
) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    ready, stop, results = context.Event(), context.Event(), context.Queue()
    reader = context.Process(
        target=_lag_reader, args=(method, spec, ready, stop, results), daemon=True
    )
    reader.start()
    loop = asyncio.get_running_loop()
    try:
        if not await loop.run_in_executor(None, ready.wait, 90):
            raise RuntimeError("the lag reader did not see the topic on the slave in 90 s")
        sent = await _paced_sends(producer, topic, args.lag_rate, args.lag_seconds, args.lag_batch)
        stop.set()
        seen = await loop.run_in_executor(None, results.get, True, LAG_DRAIN_S + 60)
        if isinstance(seen, str):
            raise RuntimeError(seen)
    finally:
        stop.set()
        reader.join(5)
        if reader.is_alive():
            reader.kill()
    lags, missing = _lags(method, sent["acks"], seen)
    acks_ms = [(acked - sent_ns) / 1e6 for sent_ns, acked, *_ in sent["acks"]]
    return {
        "rate_achieved": sent["rate_achieved"],
        "acked": len(sent["acks"]),
        "errors": len(sent["errors"]),
        "first_error": sent["errors"][0] if sent["errors"] else "",
        "behind_ticks": sent["behind_ticks"],
        "measured": len(lags),
        "missing": missing,
        "negative": sum(1 for lag in lags if lag < 0),
        "lag_p50_ms": percentile(lags, 0.5),
        "lag_p99_ms": percentile(lags, 0.99),
        "lag_max_ms": max(lags) if lags else float("nan"),
        "ack_p50_ms": percentile(acks_ms, 0.5),
        "ack_p99_ms": percentile(acks_ms, 0.99),
    }


def lag(args: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    """One group per method (a fresh master and slave each time)."""
    results = []
    for method in args.lag_method.split(","):
        with servers.tidemq_group(
            root / f"lag-{method}", args.lag_flush, args.lag_role, 1
        ) as group:
            pids = group.pids
            before = {name: servers.cpu_seconds(pid) for name, pid in pids.items()}
            start, snapshot = time.monotonic(), cpu_snapshot()
            try:
                result = asyncio.run(_lag_run(args, method, group))
            except Exception as exc:
                log.exception("lag (%s) failed", method)
                result = {"method": method, "error": f"{type(exc).__name__}: {exc}"[:300]}
            elapsed = time.monotonic() - start
            for name, pid in pids.items():
                result[f"cpu_{name}"] = (servers.cpu_seconds(pid) - before[name]) / elapsed
            result["cpu_foreign"] = cpu_foreign_cores(snapshot, cpu_snapshot())
        log.info("lag %s", result)
        results.append(result)
    return results


# -- catch-up -----------------------------------------------------------------------------------


async def _catchup_watch(
    namesrv: str, master: servers.Broker, slave_addr: str, timeout_s: float
) -> dict[str, Any]:
    """Polls the slave until its commitLogMaxOffset is the master's; the times of its port
    accepting, of its first replicated byte and of the end."""
    from tidemq import Admin

    async with Admin(namesrv) as admin:
        info = await replication.runtime_info(admin, master.address)
        high, low = int(info["commitLogMaxOffset"]), int(info["commitLogMinOffset"])
        up = first = 0.0
        deadline = time.monotonic() + timeout_s
        replicated = 0
        while time.monotonic() < deadline:
            try:
                slave = await replication.runtime_info(admin, slave_addr)
            except Exception:
                await asyncio.sleep(CATCHUP_POLL_S)
                continue
            now = time.monotonic()
            up = up or now
            replicated = int(slave["commitLogMaxOffset"])
            if replicated > 0 and not first:
                first = now
            if replicated >= high:
                return {"bytes": high - low, "done": now, "up": up, "first": first or now}
            await asyncio.sleep(CATCHUP_POLL_S)
        raise RuntimeError(f"slave at {replicated} of {high} after {timeout_s:g} s")


def _same_logs(master: Path, slave: Path) -> str:
    """'identical' or where the two commit logs first differ (names and bytes of each segment)."""
    names = sorted(p.name for p in (master / "commitlog").iterdir())
    slave_names = sorted(p.name for p in (slave / "commitlog").iterdir())
    if names != slave_names:
        return f"segments differ: master {names}, slave {slave_names}"
    for name in names:
        with (
            (master / "commitlog" / name).open("rb") as a,
            (slave / "commitlog" / name).open("rb") as b,
        ):
            position = 0
            while chunk := a.read(COMPARE_CHUNK):
                if chunk != b.read(len(chunk)):
                    return f"{name} differs in [{position}, {position + len(chunk)})"
                position += len(chunk)
    return "identical"


def catchup(args: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    """One catch-up per body size in --catchup-body."""
    results = []
    for body in (int(b) for b in str(args.catchup_body).split(",")):
        try:
            results.append(catchup_one(args, root / f"catchup-{body}", body))
        except Exception as exc:
            log.exception("catch-up (%d B bodies) failed", body)
            results.append({"body": body, "error": f"{type(exc).__name__}: {exc}"[:300]})
    return results


def catchup_one(args: argparse.Namespace, root: Path, body: int) -> dict[str, Any]:
    from bench_restart import fill

    segment = args.catchup_segment_mib * 2**20
    store = root / "master-store"
    store.mkdir(parents=True)
    count, fill_mib_s = fill(store, segment, int(args.catchup_gib * 2**30), body)
    log.info(
        "catch-up: %d messages written into the master's store at %.0f MiB/s", count, fill_mib_s
    )
    import secrets

    settings = servers.group_settings(
        "ASYNC_FLUSH", "ASYNC_MASTER", secrets.token_hex(16), mappedFileSizeCommitLog=str(segment)
    )
    timeout_s = 60 + args.catchup_gib * 1024 / CATCHUP_MIB_S_MIN
    with (
        servers.tidemq_namesrv(root) as namesrv,
        servers.tidemq_broker(root, namesrv, "master", settings, store) as master,
    ):
        spawned = time.monotonic()
        with servers.tidemq_broker(
            root, namesrv, "slave1", servers.slave_settings(settings)
        ) as slave:
            pids = (("master", master.pid), ("slave1", slave.pid))
            before = {n: servers.cpu_seconds(p) for n, p in pids}
            snapshot = cpu_snapshot()
            try:
                seen = asyncio.run(_catchup_watch(namesrv, master, slave.address, timeout_s))
            except Exception:
                log.error("master log:\n%s\nslave log:\n%s", master.log_tail(), slave.log_tail())
                raise
            cpu = {f"cpu_s_{n}": servers.cpu_seconds(p) - before[n] for n, p in pids}
            cpu["cpu_foreign"] = cpu_foreign_cores(snapshot, cpu_snapshot())
        compared = _same_logs(store, slave.store)
    mib = seen["bytes"] / 2**20
    return {
        "messages": count,
        "body": body,
        "mib": mib,
        "s_from_first_byte": seen["done"] - seen["first"],
        "mib_s_from_first_byte": mib / max(1e-6, seen["done"] - seen["first"]),
        "mib_s_from_port_up": mib / max(1e-6, seen["done"] - seen["up"]),
        "mib_s_from_spawn": mib / max(1e-6, seen["done"] - spawned),
        "compared": compared,
        **cpu,
    }


# -- the report ---------------------------------------------------------------------------------


def _f(value: Any, digits: int = 1) -> str:
    return f"{value:,.{digits}f}" if isinstance(value, int | float) else "-"


def lag_table(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        "| readable, measured by | rate achieved (msg/s) | acked (errors) / measured | lag p50 "
        "/ p99 / max (ms) | readable before the ack | never seen | send->ack p50 / p99 (ms) | "
        "CPU master / slave / foreign (cores) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        how, _, target = r["method"].partition("@")
        label = {
            "pull": f"long-poll pull of queue {','.join(map(str, LAG_PULLED_QUEUES))} by offset",
            "offset": "commitLogMaxOffset polled (runtime info)",
        }[how]
        label += (
            " **on the master** (the reader's own delay: the floor)"
            if target == "master"
            else " on the slave"
        )
        if "error" in r:
            lines.append(f"| {label} | error: {r['error']} |||||||")
            continue
        lines.append(
            f"| {label} | {_f(r['rate_achieved'], 0)} | {r['acked']:,} ({r['errors']}) / "
            f"{r['measured']:,} | {_f(r['lag_p50_ms'], 2)} / {_f(r['lag_p99_ms'], 2)} / "
            f"{_f(r['lag_max_ms'], 2)} | {r['negative']:,} | {r['missing']:,} | "
            f"{_f(r['ack_p50_ms'], 2)} / {_f(r['ack_p99_ms'], 2)} | "
            f"{_f(r.get('cpu_master'), 2)} / {_f(r.get('cpu_slave1'), 2)} / "
            f"{_f(r.get('cpu_foreign'), 2)} |"
        )
    return "\n".join(lines)


def catchup_line(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"Catch-up ({r['body']} B bodies): error: {r['error']}"
    return (
        f"Catch-up: {r['mib']:,.0f} MiB ({r['messages']:,} messages of {r['body']} B) replicated "
        f"to an empty slave in {r['s_from_first_byte']:.1f} s from its first byte: "
        f"**{r['mib_s_from_first_byte']:,.0f} MiB/s** ({r['mib_s_from_port_up']:,.0f} MiB/s from "
        f"its port accepting, {r['mib_s_from_spawn']:,.0f} MiB/s from its spawn, Python start-up "
        f"included); CPU seconds master {r['cpu_s_master']:.1f}, slave {r['cpu_s_slave1']:.1f} "
        f"(foreign CPU {r['cpu_foreign']:.2f} cores); "
        f"commit logs afterwards: {r['compared']}."
    )


def machine_line() -> str:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"nproc {os.cpu_count()}, {model}, {platform.platform()}, Python {sys.version.split()[0]}"
    )


def render(args: argparse.Namespace, parts: dict[str, Any], started: float) -> str:
    out = [
        f"## Replication, {time.strftime('%Y-%m-%d %H:%M:%S %Z')} (issue 13; "
        f"`benchmarks/bench_replication.py {args.what}"
        + (" --quick" if args.quick else "")
        + (" --no-uvloop" if args.no_uvloop else "")
        + "`)",
        "",
        f"Machine: {machine_line()}; took {(time.monotonic() - started) / 60:.1f} min.",
    ]
    if "sidebyside" in parts:
        rows, skipped = parts["sidebyside"]
        out += ["", replication.table(rows)]
        if skipped:
            out += ["", "Skipped: " + "; ".join(skipped) + "."]
    if "lag" in parts:
        out += [
            "",
            f"Replication lag: {args.lag_role} + 1 slave, {args.lag_flush} on both, "
            f"{args.lag_rate:,} msg/s of 1 KiB for {args.lag_seconds:g} s (open loop, one "
            "Python producer, "
            + ("one send per message" if args.lag_batch == 1 else f"batches of {args.lag_batch}")
            + "); lag = readable on the slave - ack received by the producer.",
            "",
            lag_table(parts["lag"], args),
        ]
    if "catchup" in parts:
        out += [line for r in parts["catchup"] for line in ("", catchup_line(r))]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "what", nargs="?", default="all", choices=("all", "sidebyside", "lag", "catchup")
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--measure-s", type=float, default=3.0)
    parser.add_argument("--quick", action="store_true", help="one short run of each part")
    parser.add_argument(
        "--systems",
        default="",
        help="comma-separated parts of system labels to run (side by side); default: all four",
    )
    parser.add_argument("--lag-rate", type=int, default=10_000)
    parser.add_argument("--lag-seconds", type=float, default=20.0)
    parser.add_argument(
        "--lag-batch",
        type=int,
        default=LAG_BATCH_DEFAULT,
        help="messages per send request in the lag case (1: one send per message)",
    )
    parser.add_argument(
        "--lag-role", default="ASYNC_MASTER", choices=("ASYNC_MASTER", "SYNC_MASTER")
    )
    parser.add_argument("--lag-flush", default="ASYNC_FLUSH", choices=("ASYNC_FLUSH", "SYNC_FLUSH"))
    parser.add_argument(
        "--lag-method",
        default="pull,offset,pull@master,offset@master",
        help="pull|offset, each on the slave or @master (the same reader on the master: the "
        "measurement's own floor)",
    )
    parser.add_argument("--catchup-gib", type=float, default=1.0)
    parser.add_argument("--catchup-body", default="1024", help="body bytes, comma-separated")
    parser.add_argument("--catchup-segment-mib", type=int, default=1024)
    parser.add_argument(
        "--no-uvloop",
        action="store_true",
        help="TideMQ processes on asyncio's default loop (every TideMQ row alike)",
    )
    parser.add_argument("--dir", type=Path, default=None, help="where the temp dirs go")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.measure_s = 1, 1.0
        args.lag_seconds, args.catchup_gib = 3.0, 0.125
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    servers.GROUP_UVLOOP["on"] = not args.no_uvloop
    # A terminated run still stops the servers it started (the context managers' finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from tidemq.remoting.loop import install_uvloop

    install_uvloop()
    started = time.monotonic()
    parts: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tidemq-repl-", dir=args.dir) as tmp:
        root = Path(tmp)
        if args.what in ("all", "sidebyside"):
            options = Options(runs=args.runs, measure_s=args.measure_s)
            wanted = [s.strip().lower() for s in args.systems.split(",") if s.strip()]
            systems = tuple(
                s
                for s in replication.SYSTEMS + replication.EXTRA_SYSTEMS
                if (s in replication.SYSTEMS and not wanted)
                or any(w in s.label.lower() for w in wanted)
            )
            parts["sidebyside"] = replication.run(root / "sidebyside", options, systems)
        if args.what in ("all", "lag"):
            parts["lag"] = lag(args, root)
        if args.what in ("all", "catchup"):
            parts["catchup"] = catchup(args, root)
    text = render(args, parts, started)
    sys.stdout.write(text)
    if not args.no_append:
        with args.out.open("a") as out:
            out.write("\n" + text)


if __name__ == "__main__":
    main()
