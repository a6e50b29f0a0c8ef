"""TLS on the command line: `tidemq dev` serving TLS only (--set tls.*), the client verbs with and
without --tls-ca, and the servers refusing bad TLS settings before they start."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidemq.cli.main import build_parser
from tidemq.cli.tls_options import server_settings
from tidemq.security.tls import ClientAuth, TlsConfigError, TlsMode
from tidemq.testing.tls_certs import KEY_PASSWORD, Pki
from tidemq.testing.wait import eventually_async

pytestmark = pytest.mark.integration

TIDEMQ = [sys.executable, "-m", "tidemq.cli.main", "--log-level", "WARNING"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tidemq(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TIDEMQ, *argv], capture_output=True, text=True, timeout=timeout, check=False
    )


@contextlib.contextmanager
def _tls_dev(pki: Pki, data_dir: Path) -> Iterator[str]:
    namesrv_port, broker_port = _free_port(), _free_port()
    log_path = data_dir / "dev.log"
    data_dir.mkdir(parents=True)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                *TIDEMQ,
                "dev",
                *("--namesrv-port", str(namesrv_port), "--broker-port", str(broker_port)),
                *("--data-dir", str(data_dir / "data")),
                *("--set", "tls.server.mode=enforcing"),
                *("--set", f"tls.server.certPath={pki.server_cert}"),
                *("--set", f"tls.server.keyPath={pki.server_key}"),
                *("--set", "tls.enable=true", "--set", f"tls.client.trustCertPath={pki.ca}"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )

    async def listening() -> bool:
        assert process.poll() is None, log_path.read_text()
        for port in (namesrv_port, broker_port):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                return False
            writer.close()
        return True

    try:
        asyncio.run(eventually_async(listening, 30, what="tidemq dev's ports listening"))
        yield f"127.0.0.1:{namesrv_port}"
    finally:
        process.terminate()
        process.wait(20)


def test_client_verbs_dial_a_tls_only_dev_cluster(pki: Pki, tmp_path: Path) -> None:
    with _tls_dev(pki, tmp_path / "dev") as namesrv:
        sent = _tidemq("--tls-ca", str(pki.ca), "send", "-n", namesrv, "-t", "T", "-b", "hi")

        async def sent_once() -> bool:  # the broker has registered (over TLS), the topic made
            nonlocal sent
            if sent.returncode != 0:
                argv = ("--tls-ca", str(pki.ca), "send", "-n", namesrv, "-t", "T", "-b", "hi")
                sent = await asyncio.to_thread(_tidemq, *argv)
            return sent.returncode == 0

        with contextlib.suppress(TimeoutError):
            asyncio.run(eventually_async(sent_once, 20, what="a send over TLS"))
        assert sent.returncode == 0, sent.stderr
        # After the verb too, and the bare --tls (system CA store) does not trust the test CA.
        after = _tidemq("send", "-n", namesrv, "-t", "T", "-b", "x", "--tls-ca", str(pki.ca))
        assert after.returncode == 0, after.stderr
        untrusted = _tidemq("send", "-n", namesrv, "-t", "T", "-b", "x", "--tls")
        assert untrusted.returncode != 0
        assert "certificate did not verify" in untrusted.stderr
        plain = _tidemq("send", "-n", namesrv, "-t", "T", "-b", "x")
        assert plain.returncode != 0


def test_servers_refuse_bad_tls_settings_before_starting(pki: Pki, tmp_path: Path) -> None:
    store = tmp_path / "store"
    broker = _tidemq(
        "broker",
        *("--data-dir", str(store), "--port", str(_free_port())),
        *("--set", f"tls.server.certPath={pki.server_cert}"),
        *("--set", f"tls.server.keyPath={pki.other_server_key}"),
    )
    assert broker.returncode == 2
    assert "tls.server.keyPath=" in broker.stderr
    assert "not the private key of tls.server.certPath" in broker.stderr
    assert "Traceback" not in broker.stderr
    assert not store.exists()  # refused before the store was opened
    namesrv = _tidemq("namesrv", "--port", "0", "--tls-mode", "enforcing")
    assert namesrv.returncode == 2
    assert "tls.server.mode=enforcing needs tls.server.certPath" in namesrv.stderr
    locked = _tidemq(
        "broker",
        "--print-config",
        *("--set", f"tls.server.certPath={pki.server_cert}"),
        *("--set", f"tls.server.keyPath={pki.server_key_locked}"),
        *("--set", f"tls.server.keyPassword={KEY_PASSWORD}"),
    )
    assert locked.returncode == 0, locked.stderr
    assert KEY_PASSWORD not in locked.stdout
    assert "tls.server.keyPassword=<redacted>" in locked.stdout


def test_namesrv_flags() -> None:
    def parse(*argv: str) -> object:
        return server_settings(build_parser().parse_args(["namesrv", *argv]), {})

    assert parse() is None
    assert parse("--tls-mode", "disabled", "--tls-cert", "c", "--tls-key", "k") is None
    permissive = parse("--tls-cert", "c.pem", "--tls-key", "k.pem")
    assert getattr(permissive, "mode", None) is TlsMode.PERMISSIVE
    required = parse(
        *("--tls-mode", "enforcing", "--tls-cert", "c", "--tls-key", "k"),
        *("--tls-client-auth", "require", "--tls-ca", "ca.pem"),
    )
    assert getattr(required, "client_auth", None) is ClientAuth.REQUIRE
    assert getattr(required, "trust_cert_path", None) == Path("ca.pem")
    with pytest.raises(TlsConfigError, match=r"needs tls\.server\.trustCertPath"):
        parse("--tls-cert", "c", "--tls-key", "k", "--tls-client-auth", "optional")
    # require without a mode is enforcing; with an explicit permissive one it is refused.
    implied = parse(
        *("--tls-cert", "c", "--tls-key", "k", "--tls-client-auth", "require", "--tls-ca", "ca")
    )
    assert getattr(implied, "mode", None) is TlsMode.ENFORCING
    with pytest.raises(TlsConfigError, match=r"mode=permissive with .*need\.client\.auth=require"):
        parse(
            *("--tls-mode", "permissive", "--tls-cert", "c", "--tls-key", "k"),
            *("--tls-client-auth", "require", "--tls-ca", "ca"),
        )
