"""Summarise py-spy's collapsed stacks: samples per function, self and inclusive, top N.

Usage: python benchmarks/profile/collapse.py broker.txt [N] [--under FUNCTION]
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

_LINE = re.compile(r" \(([^:]*):\d+\)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("path", type=Path)
    parser.add_argument("top", type=int, nargs="?", default=40)
    parser.add_argument("--under", help="count only stacks through this function name")
    args = parser.parse_args()
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in args.path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        frames = [_LINE.sub(r" (\1)", frame) for frame in stack.split(";")]
        if args.under and not any(frame.startswith(args.under + " ") for frame in frames):
            continue
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    print(f"{total} samples")
    for title, counter in (("self", own), ("inclusive", inclusive)):
        print(f"-- {title}")
        for frame, count in counter.most_common(args.top):
            print(f"{100 * count / total:5.1f}%  {frame}")


if __name__ == "__main__":
    main()
