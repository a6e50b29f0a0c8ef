"""`mapped_rss_by_file()`: what the kernel holds resident of each file this process has mapped.

The store's memory tests and the restart benchmark ask how much of a segment file is in this
process's RSS. The store's own figures (flushed, released) say what it believes it gave back;
/proc/self/smaps says what the kernel actually maps, per mapping, so a test that reads it fails
when start-up or a release touches pages it should not, however fast the machine. Linux only:
callers skip without /proc/self/smaps.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

SMAPS: Final = Path("/proc/self/smaps")
# A mapping's first line: "start-end perms offset dev inode [path]"; its fields lines follow.
_MAPPING: Final = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")


def mapped_rss_by_file() -> dict[str, int]:
    """Resident bytes per mapped file path of this process, summed over its mappings."""
    rss: dict[str, int] = {}
    current: str | None = None
    with SMAPS.open() as smaps:
        for line in smaps:
            if _MAPPING.match(line):
                parts = line.split(maxsplit=5)
                current = parts[5].strip() if len(parts) == 6 else None
            elif current is not None and line.startswith("Rss:"):
                rss[current] = rss.get(current, 0) + int(line.split()[1]) * 1024
    return rss
