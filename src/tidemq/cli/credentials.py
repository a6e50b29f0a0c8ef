"""--access-key / --secret-key: the ACL account the client verbs sign their requests with.

    tidemq --access-key AK send -t TopicA -b hi          before the verb (global) ...
    tidemq send -t TopicA -b hi --access-key AK          ... or after it
    TIDEMQ_ACCESS_KEY=AK TIDEMQ_SECRET_KEY=SK tidemq send -t TopicA -b hi

A flag wins over the environment, each key on its own (an access key on the command line with
the secret in the environment is the intended use). Prefer the environment for the secret: a
command line is visible to every user of the host (`ps`, /proc/PID/cmdline) and stays in shell
history. The secret is never printed: no default is shown in --help, and no error quotes it.
With neither key given, requests go unsigned, as to a broker without ACL.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from typing import Final

from tidemq.security.signing import Credentials

ACCESS_KEY_ENV: Final = "TIDEMQ_ACCESS_KEY"
SECRET_KEY_ENV: Final = "TIDEMQ_SECRET_KEY"


def add_global_options(parser: argparse.ArgumentParser) -> None:
    """The flags on the `tidemq` command itself (before the verb)."""
    _add(parser, default=None)


def add_options(parser: argparse.ArgumentParser) -> None:
    """The same flags on a verb that talks to servers: given after the verb they win, and absent
    they leave what was given before the verb alone (SUPPRESS: argparse copies only what a
    subcommand's parser set)."""
    _add(parser, default=argparse.SUPPRESS)


def _add(parser: argparse.ArgumentParser, *, default: object) -> None:
    parser.add_argument(
        "--access-key",
        default=default,
        metavar="AK",
        help=f"ACL access key to sign requests with (default: ${ACCESS_KEY_ENV})",
    )
    parser.add_argument(
        "--secret-key",
        default=default,
        metavar="SK",
        help=f"its secret key (default: ${SECRET_KEY_ENV}, the safer place: a command line "
        "is visible in ps)",
    )


def resolve(
    access_key: str | None, secret_key: str | None, environ: Mapping[str, str]
) -> Credentials | None:
    """The account from the flags, else the environment; None when neither names a key.

    Raises:
        ValueError: only one of the two keys is given (the message names the missing one).
    """
    access = access_key or environ.get(ACCESS_KEY_ENV) or None
    secret = secret_key or environ.get(SECRET_KEY_ENV) or None
    if access is None and secret is None:
        return None
    if access is None:
        raise ValueError(
            f"a secret key was given without an access key (--access-key or {ACCESS_KEY_ENV})"
        )
    if secret is None:
        raise ValueError(
            f"access key {access!r} has no secret key (--secret-key or {SECRET_KEY_ENV})"
        )
    return Credentials(access, secret)


def credentials_of(args: argparse.Namespace) -> Credentials | None:
    """The verb's account (`resolve` over its flags and os.environ); a usage error (exit 2)
    when only one key is given."""
    try:
        return resolve(
            getattr(args, "access_key", None), getattr(args, "secret_key", None), os.environ
        )
    except ValueError as error:
        print(f"tidemq: {error}", file=sys.stderr)
        raise SystemExit(2) from None
