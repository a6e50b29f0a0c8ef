"""Event-loop selection for the process roots (cli, dev): uvloop when it is installed.

uvloop roughly halves the per-frame cost of the transport; TideMQ works without it (Windows, PyPy),
so the choice is made once at process start and never by library code.
"""

from __future__ import annotations

import asyncio
import importlib
import logging

logger = logging.getLogger(__name__)


def install_uvloop() -> bool:
    """Install uvloop's event-loop policy if uvloop can be imported.

    Returns:
        True when uvloop is now the policy, False when it is unavailable (the default loop stays).
    """
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        logger.info("uvloop not available; using the default asyncio event loop")
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True
