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
import dataclasses
import json
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
from tidemq.broker.config import BrokerConfig, StorePathError
from tidemq.broker.config_file import load_broker_config, render_config
from tidemq.broker.failover import ControlledBroker
from tidemq.broker.tls_setup import check_tls_files
from tidemq.cli import tls_options
from tidemq.clock import SystemClock
from tidemq.metrics.gc_pauses import gc_tuning_wanted, tune_after_start
from tidemq.namesrv.app import NamesrvApp
from tidemq.namesrv.config import NamesrvConfig
from tidemq.remoting.acceptor import ListenError, raise_open_files_limit
from tidemq.remoting.caps import (
    CONNECTIONS_MAX_DEFAULT,
    CONNECTIONS_PER_ADDRESS_MAX_DEFAULT,
    ConnectionLimits,
)
from tidemq.remoting.loop import install_uvloop
from tidemq.security.acl_file import AclFileError, load_acl_file
from tidemq.security.tls import TlsConfigError, TlsServerSettings
from tidemq.store.lock import StoreLockedError

log = logging.getLogger("tidemq")

# The slave of `tidemq dev --slave` listens here by default: RocketMQ's quick-start habit of
# master 10911, slave 10921 (clear of the master's VIP port 10909 and HA port 10912).
DEV_SLAVE_PORT_DEFAULT: Final = 10921
# The environment variable load_broker_config reads haSecret from (TIDEMQ_ + HA_SECRET).
HA_SECRET_ENV: Final = "TIDEMQ_HA_SECRET"
# ... and innerClientAuthenticationCredentials.
INNER_CREDENTIALS_ENV: Final = "TIDEMQ_INNER_CLIENT_AUTHENTICATION_CREDENTIALS"


def add_parsers(verbs: Any) -> None:
    namesrv = verbs.add_parser("namesrv", help="run a name server")
    namesrv.add_argument("--port", type=int, default=9876, help="listen port (default 9876)")
    namesrv.add_argument("--data-dir", type=Path, default=None, help="where KV config is kept")
    namesrv.add_argument(
        "--max-connections",
        type=int,
        default=CONNECTIONS_MAX_DEFAULT,
        help=f"connections served at once (default {CONNECTIONS_MAX_DEFAULT:,}; 0: no cap)",
    )
    namesrv.add_argument(
        "--max-connections-per-address",
        type=int,
        default=CONNECTIONS_PER_ADDRESS_MAX_DEFAULT,
        help="of those, from one remote address (default "
        f"{CONNECTIONS_PER_ADDRESS_MAX_DEFAULT:,}; 0: no cap)",
    )
    namesrv.add_argument(
        "--acl-file",
        type=Path,
        default=None,
        help="plain_acl.yml: broker registration and other writes need an admin account's"
        " signature, route and topic reads any account's",
    )
    tls_options.add_server_flags(namesrv)  # --tls-mode/--tls-cert/--tls-key/--tls-ca/...
    namesrv.add_argument(
        "--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port"
    )
    namesrv.set_defaults(run=run_namesrv)

    broker = verbs.add_parser("broker", help="run a broker")
    broker.add_argument("-c", "--config", type=Path, help="RocketMQ-style broker.conf")
    _add_broker_flags(broker)
    broker.add_argument(
        "--print-config", action="store_true", help="print the effective configuration and exit"
    )
    broker.set_defaults(run=run_broker)
    _add_dev_parser(verbs)


def _add_dev_parser(verbs: Any) -> None:
    dev = verbs.add_parser("dev", help="name server + broker in one process, for development")
    dev.add_argument("--namesrv-port", type=int, default=9876)
    dev.add_argument(
        "--broker-port",
        type=int,
        default=10911,
        help="the broker's port (default 10911); it also binds port-2 (the VIP channel) and,"
        " with --slave, port+1 (HA)",
    )
    dev.add_argument("--data-dir", type=Path, default=Path("data"))
    dev.add_argument(
        "--slave",
        action="store_true",
        help="also run a slave of the broker (data in <data-dir>/master and <data-dir>/slave)",
    )
    dev.add_argument("--slave-port", type=int, default=DEV_SLAVE_PORT_DEFAULT)
    dev.add_argument(
        "--acl-file",
        type=Path,
        default=None,
        help="plain_acl.yml: ACL on for the name server and the broker(s), which sign their own"
        " requests with the file's first admin account unless"
        " --set innerClientAuthenticationCredentials=... names one",
    )
    dev.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any broker.conf key, e.g. --set flushDiskType=SYNC_FLUSH",
    )
    dev.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="Prometheus metrics: the broker on this port, the name server on port+1, a"
        " --slave on port+2 (docs/operations.md)",
    )
    dev.set_defaults(run=run_dev)


def _add_broker_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namesrv-addr", help="name servers, ';'-separated (namesrvAddr)")
    parser.add_argument(
        "--port",
        type=int,
        help="listen port (listenPort); the broker also binds port-2 (the VIP channel, unless"
        " vipChannelEnabled=false) and, with haSecret, port+1 (HA; haListenPort moves it)",
    )
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


async def _serve(*apps: Any, gc_tuning: bool = False) -> None:
    """Start the apps in order, wait for SIGINT/SIGTERM, stop them in reverse order. With
    `gc_tuning`, what the started apps hold is frozen out of the collector's walks (gc_pauses)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    started: list[Any] = []
    try:
        for app in apps:
            await app.start()
            started.append(app)
        if gc_tuning:
            tune_after_start()
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
    config = NamesrvConfig(listen_port=args.port, kv_config_path=kv_path, acl_file=args.acl_file)
    if args.max_connections < 0 or args.max_connections_per_address < 0:
        print("tidemq namesrv: --max-connections* must be >= 0 (0: no cap)", file=sys.stderr)
        return 2
    limits = ConnectionLimits(
        connections_max=args.max_connections,
        connections_per_address_max=args.max_connections_per_address,
    )
    try:
        config = dataclasses.replace(config, limits=limits, tls=tls_options.server_settings(args))
        app = NamesrvApp(config, SystemClock(), metrics_port=args.metrics_port)
    except (AclFileError, TlsConfigError) as exc:
        print(f"tidemq namesrv: {exc}", file=sys.stderr)
        return 2
    hints = {args.port: ": choose another --port"}
    if args.metrics_port is not None:
        hints[args.metrics_port] = " (metrics): choose another --metrics-port"
    return _run("namesrv", [app], hints)


def run_broker(args: argparse.Namespace) -> int:
    try:
        config = load_broker_config(args.config, os.environ, _broker_overrides(args))
        _check_acl_file(config)
    except (ValueError, OSError) as exc:
        print(f"tidemq broker: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(render_config(config) + open_files_line())
        return 0
    try:
        check_tls_files(config)  # before the store is opened
    except TlsConfigError as exc:
        print(f"tidemq broker: {exc}", file=sys.stderr)
        return 2
    _start_process()
    app: Any
    if config.enable_controller_mode:  # the controller decides the role (broker/failover.py)
        app = ControlledBroker(config, SystemClock())
    else:
        app = BrokerApp(config, SystemClock())
    return _run("broker", [app], broker_port_hints(config, "--port"))


def _check_acl_file(config: BrokerConfig) -> None:
    """With aclEnable, the ACL file must be usable before anything starts (the broker reads
    it again when it starts; a reload later keeps the old table on a bad edit).

    Raises:
        AclFileError: it is not.
    """
    if config.acl_enable and config.acl_file_path is not None:
        load_acl_file(config.acl_file_path)


def dev_overrides(args: argparse.Namespace, env: Mapping[str, str]) -> list[dict[str, str]]:
    """The broker.conf overrides of `tidemq dev`'s brokers: the master, then the slave if
    --slave. --set keys apply to both; a slave's role, id, port and store are its own."""
    data_dir: Path = args.data_dir.resolve()
    common = _parse_sets(args.set)
    if args.acl_file is not None:
        common = {**_dev_acl_settings(args.acl_file.resolve(), common, env), **common}
    master = {
        "namesrvAddr": f"127.0.0.1:{args.namesrv_port}",
        "listenPort": str(args.broker_port),
        "storePathRootDir": str(data_dir / ("master" if args.slave else "broker")),
        "brokerIP1": "127.0.0.1",
        **_dev_metrics(args.metrics_port),
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
        **_dev_metrics(args.metrics_port + 2 if args.metrics_port is not None else None),
    }
    return [master, slave]


def _dev_metrics(port: int | None) -> dict[str, str]:
    """`tidemq dev --metrics-port`: a broker's PROM exporter keys (none without the flag)."""
    if port is None:
        return {}
    return {"metricsExporterType": "PROM", "metricsPromExporterPort": str(port)}


def _dev_acl_settings(
    acl_file: Path, common: Mapping[str, str], env: Mapping[str, str]
) -> dict[str, str]:
    """`tidemq dev --acl-file`: the brokers check requests against the file and sign their
    own with innerClientAuthenticationCredentials, by default the file's first admin account
    (a development shortcut: production brokers name theirs in broker.conf).

    Raises:
        ValueError: the file is unusable, or has no admin account and none was given.
    """
    settings = {"aclEnable": "true", "aclFilePath": str(acl_file)}
    if "innerClientAuthenticationCredentials" in common or INNER_CREDENTIALS_ENV in env:
        return settings
    table = load_acl_file(acl_file)
    admin = next((account for account in table.accounts.values() if account.admin), None)
    if admin is None:
        raise ValueError(
            f"{acl_file} has no admin account for the brokers to register with: add one or"
            " --set innerClientAuthenticationCredentials=..."
        )
    settings["innerClientAuthenticationCredentials"] = json.dumps(
        {"accessKey": admin.access_key, "secretKey": admin.secret_key}
    )
    return settings


def run_dev(args: argparse.Namespace) -> int:
    data_dir: Path = args.data_dir.resolve()
    try:
        configs = [
            load_broker_config(None, os.environ, overrides)
            for overrides in dev_overrides(args, os.environ)
        ]
        for config in configs:
            _check_acl_file(config)
            check_tls_files(config)  # TlsConfigError is a ValueError
    except ValueError as exc:
        print(f"tidemq dev: {exc}", file=sys.stderr)
        return 2
    _start_process()
    clock = SystemClock()
    namesrv = NamesrvApp(
        NamesrvConfig(
            listen_port=args.namesrv_port,
            kv_config_path=data_dir / "namesrv" / "kvConfig.json",
            acl_file=args.acl_file.resolve() if args.acl_file is not None else None,
            tls=_dev_namesrv_tls(configs[0]),
        ),
        clock,
        metrics_port=args.metrics_port + 1 if args.metrics_port is not None else None,
    )
    log.info("tidemq dev: %s, data in %s", _dev_addresses(args.namesrv_port, configs), data_dir)
    hints = {args.namesrv_port: ": choose another --namesrv-port"}
    for config, flag in zip(configs, ("--broker-port", "--slave-port"), strict=False):
        hints.update(broker_port_hints(config, flag))
    if args.metrics_port is not None:
        hints[args.metrics_port + 1] = " (the name server's metrics): choose another --metrics-port"
    return _run("dev", [namesrv, *(BrokerApp(config, clock) for config in configs)], hints)


def _run(verb: str, apps: list[Any], port_hints: Mapping[int, str]) -> int:
    """Serve `apps` until Ctrl-C; what stops a start is one line on stderr and exit status 1:
    a port that cannot be bound (with the setting that chose it), an unusable store directory,
    a store another broker holds (nothing was touched)."""
    try:
        gc_tuning = gc_tuning_wanted(os.environ)
    except ValueError as exc:
        print(f"tidemq {verb}: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(*apps, gc_tuning=gc_tuning))
    except ListenError as exc:
        print(f"tidemq {verb}: {listen_error_line(exc, port_hints)}", file=sys.stderr)
        return 1
    except (StoreLockedError, StorePathError) as exc:
        print(f"tidemq {verb}: {exc}", file=sys.stderr)
        return 1
    return 0


def listen_error_line(exc: ListenError, port_hints: Mapping[int, str]) -> str:
    """ "port 10909 is in use (the VIP channel port, listenPort-2): choose ..." """
    hint = port_hints.get(exc.port)
    if hint is None:
        return str(exc)
    state = "is in use" if exc.in_use else f"cannot be bound ({exc.strerror})"
    return f"port {exc.port} on {exc.host} {state}{hint}"


def broker_port_hints(config: BrokerConfig, port_flag: str) -> dict[int, str]:
    """What to change when one of a broker's ports cannot be bound, by port (`port_flag`: the
    command-line flag that sets listenPort)."""
    listen = f"choose another listenPort ({port_flag})"
    hints = {config.listen_port: f": {listen}"}
    if config.vip_port is not None:
        hints[config.vip_port] = (
            f" (the VIP channel port, listenPort-2): {listen}, or --set vipChannelEnabled=false"
        )
    if config.ha_listen_port:
        hints[config.ha_listen_port] = " (the HA port): choose another haListenPort"
    elif config.ha_port:
        hints[config.ha_port] = f" (the HA port, listenPort+1): {listen}, or set haListenPort"
    if config.metrics_exporter_type == "PROM":
        hints[config.metrics_prom_exporter_port] = (
            " (metrics): choose another metricsPromExporterPort"
        )
    return hints


def _dev_namesrv_tls(config: BrokerConfig) -> TlsServerSettings | None:
    """`tidemq dev --set tls.server.*`: the name server's port speaks what the brokers' do,
    with the same certificate (one set of flags for the whole development cluster)."""
    settings = config.tls_server_settings
    return settings if settings.enabled else None


def _dev_addresses(namesrv_port: int, configs: list[BrokerConfig]) -> str:
    """ "name server 127.0.0.1:9876, broker 127.0.0.1:10911" (master and slave with --slave)."""
    words = ["broker"] if len(configs) == 1 else ["master", "slave"]
    brokers = [
        f"{word} 127.0.0.1:{config.listen_port}"
        for word, config in zip(words, configs, strict=True)
    ]
    return ", ".join([f"name server 127.0.0.1:{namesrv_port}", *brokers])
