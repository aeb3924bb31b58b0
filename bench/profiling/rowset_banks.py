#!/usr/bin/env python3
"""Bank model of the row-set decode kernel's shared-memory reads of a tile.

It covers the reads behind the layout choices in the measurement log
(bench/history/results-log-2026-11.md: "the decode call against its floor,
part by part"):
- the K row words and norms of TokMTiles' score fragments;
- the V row words and norms of its value fragments.

For each stage layout it counts the wavefronts per warp load. A wavefront
is the largest number of distinct 4-byte words that one bank holds among
the warp's 32 addresses. A conflict-free load is one wavefront.

The layouts are:
- token strides with the 16-byte gap, or dense;
- value token pairs (2i, 2i + 1) or spread (i, i + 4): TokMTiles' kSpreadV;
- for dense K rows, also TMA's 32-byte swizzle.

Pure arithmetic: runs anywhere (python3 bench/profiling/rowset_banks.py).
"""


def wavefronts(addrs):
    banks = {}
    for a in addrs:
        banks.setdefault((a // 4) % 32, set()).add(a // 4)
    return max(len(v) for v in banks.values())


def swizzle32(a):
    return a ^ (((a >> 7) & 1) << 4)


def k_loads(tok, swz):
    """Lane (g, i) = lane 4g + i. It reads row words 4k + i of tokens g and
    g + 8, and the norm (byte 64) of each, for each of the 8 heads."""
    loads = []
    for head in range(8):
        for nt in range(2):
            for k in range(4):
                loads.append([swz(tok * (g + 8 * nt) + 68 * head + 16 * k + 4 * i) for g in range(8) for i in range(4)])
            loads.append([swz(tok * (g + 8 * nt) + 68 * head + 64) for g in range(8) for i in range(4)])
    return loads


def v_loads(vb, tok, spread):
    """Lane (g, i) reads V row word g (and g + 8 for 4-bit V) of its value
    tokens, and the V norms of tokens g and g + 8."""
    row = 16 * vb + 4
    first = (lambda i: i) if spread else (lambda i: 2 * i)
    second = 4 if spread else 1
    loads = []
    for head in range(8):
        for j in range(2):
            for t in range(2):
                for w in range(2 if vb == 4 else 1):
                    loads.append([tok * (first(i) + 8 * j + t * second) + row * head + 4 * g + 32 * w
                                  for g in range(8) for i in range(4)])
        for nt in range(2):
            loads.append([tok * (g + 8 * nt) + row * head + 16 * vb for g in range(8) for i in range(4)])
    return loads


def report(name, loads):
    total = sum(wavefronts(l) for l in loads)
    print(f"  {name:48s} {len(loads):4d} loads  {total:4d} wavefronts")


def main():
    ident = lambda a: a
    print("K rows (68 bytes per head, 8 heads per token):")
    report("gap (stride 560 bytes)", k_loads(560, ident))
    report("dense (544)", k_loads(544, ident))
    report("dense, 32-byte TMA swizzle", k_loads(544, swizzle32))
    for vb in (4, 2):
        row = 16 * vb + 4
        print(f"{vb}-bit V rows ({row} bytes per head):")
        report(f"gap (stride {8 * row + 16}), pairs (2i, 2i + 1)", v_loads(vb, 8 * row + 16, False))
        report(f"dense ({8 * row}), pairs (2i, 2i + 1)", v_loads(vb, 8 * row, False))
        report(f"dense ({8 * row}), spread pairs (i, i + 4)", v_loads(vb, 8 * row, True))


if __name__ == "__main__":
    main()
