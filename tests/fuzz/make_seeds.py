#!/usr/bin/env python3
"""Writes the small seed corpora of the fuzz targets (run by hand; standard library only).

corpus/indexed_dataset/*: <u16 .idx length><.idx bytes><.bin bytes> (FORMATS.md §1.3 layout).
corpus/npy/*: .npy files as numpy.save writes them (FORMATS.md §3.10).
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 8, 7: 4, 8: 2}
FMT = {1: "B", 2: "b", 3: "h", 4: "i", 5: "q", 6: "d", 7: "f", 8: "H"}


def indexed(code, seqs, docs):
    size = SIZES[code]
    bin_ = b"".join(struct.pack("<%d%s" % (len(s), FMT[code]), *s) for s in seqs)
    ptrs, p = [], 0
    for s in seqs:
        ptrs.append(p)
        p += len(s) * size
    idx = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(seqs), len(docs))
    idx += struct.pack("<%di" % len(seqs), *[len(s) for s in seqs])
    idx += struct.pack("<%dq" % len(seqs), *ptrs)
    idx += struct.pack("<%dq" % len(docs), *docs)
    return struct.pack("<H", len(idx)) + idx + bin_


def npy(descr, shape, fmt, values):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    header += " " * (21 - len(shape.strip("(),").split(",")[0]))
    hlen = len(header) + 1
    header += " " * (64 - (10 + hlen) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + struct.pack(
        "<%d%s" % (len(values), fmt), *values
    )


seeds = {
    "indexed_dataset/uint16_3seq_2doc": indexed(8, [[1, 2, 3], [50256], [7, 8]], [0, 2, 3]),
    "indexed_dataset/int32_1seq": indexed(4, [[70000, -1, 5]], [0, 1]),
    "indexed_dataset/float32_2seq": indexed(7, [[1.0, 2.0], [3.0]], [0, 1, 2]),
    "indexed_dataset/empty": indexed(8, [], [0]),
    "npy/i4_1d": npy("<i4", "(3,)", "i", [0, 1, 2]),
    "npy/i8_2d": npy("<i8", "(2, 2)", "q", [0, 0, 1, 5]),
    "npy/u4_1d": npy("<u4", "(2,)", "I", [1, 0]),
    "npy/i2_1d": npy("<i2", "(4,)", "h", [0, 1, 0, 1]),
}
for name, data in seeds.items():
    with open(os.path.join(HERE, "corpus", name), "wb") as f:
        f.write(data)
