"""Server verbs: `tidemq namesrv`, `tidemq broker`, `tidemq dev`.

Each builds the process's composition root(s), runs until SIGINT/SIGTERM, then stops them in
reverse order, so Ctrl-C always leaves a clean store (offsets persisted, checkpoint written).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import resource
import signal
import sys
from pathlib import Path
from typing import Any

from tidemq.broker.app import BrokerApp
from tidemq.broker.config_file import load_broker_config, render_config
from tidemq.clock import SystemClock
from tidemq.namesrv.app import NamesrvApp
from tidemq.namesrv.config import NamesrvConfig
from tidemq.remoting.acceptor import raise_open_files_limit
from tidemq.remoting.loop import install_uvloop
from tidemq.store.lock import StoreLockedError

log = logging.getLogger("tidemq")


def add_parsers(verbs: Any) -> None:
    namesrv = verbs.add_parser("namesrv", help="run a name server")
    namesrv.add_argument("--port", type=int, default=9876, help="listen port (default 9876)")
    namesrv.add_argument("--data-dir", type=Path, default=None, help="where KV config is kept")
    namesrv.set_defaults(run=run_namesrv)

    broker = verbs.add_parser("broker", help="run a broker")
    broker.add_argument("-c", "--config", type=Path, help="RocketMQ-style broker.conf")
    _add_broker_flags(broker)
    broker.add_argument(
        "--print-config", action="store_true", help="print the effective configuration and exit"
    )
    broker.set_defaults(run=run_broker)

    dev = verbs.add_parser("dev", help="name server + broker in one process, for development")
    dev.add_argument("--namesrv-port", type=int, default=9876)
    dev.add_argument("--broker-port", type=int, default=10911)
    dev.add_argument("--data-dir", type=Path, default=Path("data"))
    dev.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any broker.conf key, e.g. --set flushDiskType=SYNC_FLUSH",
    )
    dev.set_defaults(run=run_dev)


def _add_broker_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namesrv-addr", help="name servers, ';'-separated (namesrvAddr)")
    parser.add_argument("--port", type=int, help="listen port (listenPort)")
    parser.add_argument("--data-dir", type=Path, help="store root (storePathRootDir)")
    parser.add_argument("--broker-name", help="brokerName")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any broker.conf key; flags win over the file and the environment",
    )


def _parse_sets(pairs: list[str]) -> dict[str, str]:
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--set wants KEY=VALUE, got {pair!r}")
        result[key.strip()] = value.strip()
    return result


def _broker_overrides(args: argparse.Namespace) -> dict[str, str]:
    overrides = _parse_sets(args.set)
    if args.namesrv_addr:
        overrides["namesrvAddr"] = args.namesrv_addr
    if args.port is not None:
        overrides["listenPort"] = str(args.port)
    if args.data_dir is not None:
        overrides["storePathRootDir"] = str(args.data_dir)
    if args.broker_name:
        overrides["brokerName"] = args.broker_name
    return overrides


async def _serve(*apps: Any) -> None:
    """Start the apps in order, wait for SIGINT/SIGTERM, stop them in reverse order."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    started: list[Any] = []
    try:
        for app in apps:
            await app.start()
            started.append(app)
        log.info("ready; Ctrl-C to stop")
        await stop.wait()
        log.info("stopping")
    finally:
        for app in reversed(started):
            await app.stop()
    log.info("stopped cleanly")


def _start_process() -> None:
    """What every server process does first: uvloop if installed, and every descriptor the
    hard limit allows (each connection is one; out of them, accepting stops)."""
    install_uvloop()
    before, now = raise_open_files_limit()
    if now != before:
        log.info("open files limit (RLIMIT_NOFILE) raised from %d to %d", before, now)
    else:
        log.info("open files limit (RLIMIT_NOFILE): %d", now)


def open_files_line() -> str:
    """The --print-config comment on the descriptor limit a started server will have."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    shown = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    if soft == hard:
        return f"# Open files (RLIMIT_NOFILE): {shown} (the soft limit is the hard limit)"
    return (
        f"# Open files (RLIMIT_NOFILE): {shown} at start "
        f"(the soft limit, {soft}, is raised to the hard limit)"
    )


def run_namesrv(args: argparse.Namespace) -> int:
    _start_process()
    kv_path = args.data_dir / "kvConfig.json" if args.data_dir else None
    app = NamesrvApp(NamesrvConfig(listen_port=args.port, kv_config_path=kv_path), SystemClock())
    asyncio.run(_serve(app))
    return 0


def run_broker(args: argparse.Namespace) -> int:
    try:
        config = load_broker_config(args.config, os.environ, _broker_overrides(args))
    except (ValueError, OSError) as exc:
        print(f"tidemq broker: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(render_config(config) + open_files_line())
        return 0
    _start_process()
    try:
        asyncio.run(_serve(BrokerApp(config, SystemClock())))
    except StoreLockedError as exc:  # another broker owns the store: one line, nothing touched
        print(f"tidemq broker: {exc}", file=sys.stderr)
        return 1
    return 0


def run_dev(args: argparse.Namespace) -> int:
    data_dir: Path = args.data_dir.resolve()
    overrides = _parse_sets(args.set)
    overrides.setdefault("namesrvAddr", f"127.0.0.1:{args.namesrv_port}")
    overrides.setdefault("listenPort", str(args.broker_port))
    overrides.setdefault("storePathRootDir", str(data_dir / "broker"))
    overrides.setdefault("brokerIP1", "127.0.0.1")
    try:
        config = load_broker_config(None, os.environ, overrides)
    except ValueError as exc:
        print(f"tidemq dev: {exc}", file=sys.stderr)
        return 2
    _start_process()
    clock = SystemClock()
    namesrv = NamesrvApp(
        NamesrvConfig(
            listen_port=args.namesrv_port, kv_config_path=data_dir / "namesrv" / "kvConfig.json"
        ),
        clock,
    )
    log.info(
        "tidemq dev: name server 127.0.0.1:%d, broker 127.0.0.1:%d, data in %s",
        args.namesrv_port,
        args.broker_port,
        data_dir,
    )
    try:
        asyncio.run(_serve(namesrv, BrokerApp(config, clock)))
    except StoreLockedError as exc:  # another broker owns the store: one line, nothing touched
        print(f"tidemq dev: {exc}", file=sys.stderr)
        return 1
    return 0
