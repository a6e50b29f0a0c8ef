"""Server verbs: `tidemq namesrv`, `tidemq broker`, `tidemq dev`.

Each builds the process's composition root(s), runs until SIGINT/SIGTERM, then stops them in
reverse order, so Ctrl-C always leaves a clean store (offsets persisted, checkpoint written).

`tidemq dev --slave` runs a name server, a master and its slave (same brokerName, brokerId 1,
brokerRole SLAVE) in one event loop, with data under <data-dir>/master and <data-dir>/slave: a
replicated broker group in one command. Both brokers get one haSecret, random per start unless
given (--set haSecret=... or TIDEMQ_HA_SECRET); nothing outside the process needs to know it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import resource
import secrets
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from tidemq.broker.app import BrokerApp
from tidemq.broker.config import BrokerConfig
from tidemq.broker.config_file import load_broker_config, render_config
from tidemq.broker.failover import ControlledBroker
from tidemq.clock import SystemClock
from tidemq.namesrv.app import NamesrvApp
from tidemq.namesrv.config import NamesrvConfig
from tidemq.remoting.acceptor import raise_open_files_limit
from tidemq.remoting.loop import install_uvloop
from tidemq.store.lock import StoreLockedError

log = logging.getLogger("tidemq")

# The slave of `tidemq dev --slave` listens here by default: RocketMQ's quick-start habit of
# master 10911, slave 10921 (clear of the master's VIP port 10909 and HA port 10912).
DEV_SLAVE_PORT_DEFAULT: Final = 10921
# The environment variable load_broker_config reads haSecret from (TIDEMQ_ + HA_SECRET).
HA_SECRET_ENV: Final = "TIDEMQ_HA_SECRET"


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
        "--slave",
        action="store_true",
        help="also run a slave of the broker (data in <data-dir>/master and <data-dir>/slave)",
    )
    dev.add_argument("--slave-port", type=int, default=DEV_SLAVE_PORT_DEFAULT)
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
        if config.enable_controller_mode:  # the controller decides the role (broker/failover.py)
            asyncio.run(_serve(ControlledBroker(config, SystemClock())))
        else:
            asyncio.run(_serve(BrokerApp(config, SystemClock())))
    except StoreLockedError as exc:  # another broker owns the store: one line, nothing touched
        print(f"tidemq broker: {exc}", file=sys.stderr)
        return 1
    return 0


def dev_overrides(args: argparse.Namespace, env: Mapping[str, str]) -> list[dict[str, str]]:
    """The broker.conf overrides of `tidemq dev`'s brokers: the master, then the slave if
    --slave. --set keys apply to both; a slave's role, id, port and store are its own."""
    data_dir: Path = args.data_dir.resolve()
    common = _parse_sets(args.set)
    master = {
        "namesrvAddr": f"127.0.0.1:{args.namesrv_port}",
        "listenPort": str(args.broker_port),
        "storePathRootDir": str(data_dir / ("master" if args.slave else "broker")),
        "brokerIP1": "127.0.0.1",
        **common,
    }
    if not args.slave:
        return [master]
    if "haSecret" not in master and HA_SECRET_ENV not in env:
        master["haSecret"] = secrets.token_hex(16)  # one run's secret, shared in this process
    slave = {
        **master,
        "listenPort": str(args.slave_port),
        "storePathRootDir": str(data_dir / "slave"),
        "brokerRole": "SLAVE",
        "brokerId": "1",
    }
    return [master, slave]


def run_dev(args: argparse.Namespace) -> int:
    data_dir: Path = args.data_dir.resolve()
    try:
        configs = [
            load_broker_config(None, os.environ, overrides)
            for overrides in dev_overrides(args, os.environ)
        ]
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
    log.info("tidemq dev: %s, data in %s", _dev_addresses(args.namesrv_port, configs), data_dir)
    try:
        asyncio.run(_serve(namesrv, *(BrokerApp(config, clock) for config in configs)))
    except StoreLockedError as exc:  # another broker owns the store: one line, nothing touched
        print(f"tidemq dev: {exc}", file=sys.stderr)
        return 1
    return 0


def _dev_addresses(namesrv_port: int, configs: list[BrokerConfig]) -> str:
    """ "name server 127.0.0.1:9876, broker 127.0.0.1:10911" (master and slave with --slave)."""
    words = ["broker"] if len(configs) == 1 else ["master", "slave"]
    brokers = [
        f"{word} 127.0.0.1:{config.listen_port}"
        for word, config in zip(words, configs, strict=True)
    ]
    return ", ".join([f"name server 127.0.0.1:{namesrv_port}", *brokers])
