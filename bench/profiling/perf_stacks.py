#!/usr/bin/env python3
"""Summarises `perf script` call-graph output: the share of samples by
function, self and inclusive, over the samples whose stack holds a frame
matching INCLUDE and none matching EXCLUDE.

Usage: perf_stacks.py PERF_SCRIPT_TXT [INCLUDE_REGEX] [EXCLUDE_REGEX] [TOP=40]
e.g. perf_stacks.py put.txt 'PutSession' '' 60 (a dense put's server work),
     perf_stacks.py dl.txt 'KvService::Attend' 'CudaMemory.*Reserve' (an
     Attend without its staging's growth).
"""
import collections
import re
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    inc = re.compile(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] else None
    exc = re.compile(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3] else None
    top = int(sys.argv[4]) if len(sys.argv) > 4 else 40
    self_count, incl_count = collections.Counter(), collections.Counter()
    kept = total = 0
    stack = []

    def flush():
        nonlocal kept, total
        if not stack:
            return
        total += 1
        if inc and not any(inc.search(f) for f in stack):
            return
        if exc and any(exc.search(f) for f in stack):
            return
        kept += 1
        self_count[stack[0]] += 1
        for f in set(stack):
            incl_count[f] += 1

    with open(sys.argv[1], errors="replace") as lines:
        for line in lines:
            if not line.strip():
                flush()
                stack = []
            elif line[0] in " \t":  # a frame: "addr symbol+0xoff (dso)"
                parts = line.strip().split(None, 1)
                if len(parts) == 2:
                    stack.append(re.sub(r"\+0x[0-9a-f]+$", "", parts[1].split(" (")[0])[:150])
    flush()
    print(f"samples {kept} of {total}")
    for title, counts in (("self", self_count), ("inclusive", incl_count)):
        print(f"-- {title}")
        for f, c in counts.most_common(top):
            print(f"{100.0 * c / max(kept, 1):6.2f}% {f}")


if __name__ == "__main__":
    main()
