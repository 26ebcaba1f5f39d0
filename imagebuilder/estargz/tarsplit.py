"""A layer's tar-split: the tar's own bytes around its files' contents, which containers/storage
keeps to give back the layer's exact tar (and so its DiffID) after a partial pull.

The format is vbatts/tar-split's JSON packer (tar/storage/entry.go, packer.go), as its
disassembler writes it (tar/asm/disassemble.go): one JSON document a line, in the tar's order,
each with its `position` (0, 1, ...):
  - a segment, {"type": 2, "payload": base64}: raw tar bytes: the padding of the previous
    entry's content, then an entry's header blocks (PAX ones included); the last but one holds
    the last padding and the tar's end blocks, the last is empty (nothing after them);
  - a file, {"type": 1, "name": ..., "size": ..., "payload": base64}: one per entry, content or
    not, standing for the entry's content; its payload the CRC-64 (ISO polynomial, big-endian,
    Go's hash/crc64) of the content, which tar-split checks when it reassembles, null when empty.
For a tar whose names need no JSON escapes, the lines are those tar-split's own disassembler
writes for it, byte for byte (checked with tar-split 0.11.2's asm and storage). Pure: the writer
hands in the bytes as it writes them.
"""

from __future__ import annotations

import base64
import json

FILE = 1
SEGMENT = 2

_REVERSED_BITS = bytes(int(f"{b:08b}"[::-1], 2) for b in range(256))
_ONES = (1 << 64) - 1


def _reduce(value: int) -> int:
    """`value` mod P, P = x^64 + x^4 + x^3 + x + 1 (ISO 3309) over GF(2), bit k the coefficient of x^k.
    P is sparse, and so is x^(64s) mod P = x^4s + x^3s + x^s + 1 for s a power of two (squaring
    in GF(2) doubles exponents): each step folds the bits above 64s down with four shifts, so a
    whole chunk reduces in big-integer operations, about 100 MB/s, with no loop per byte."""
    length = value.bit_length()
    while length > 64:
        s = 1 << max(0, (length // 128).bit_length() - 1)
        high, value = value >> 64 * s, value & ((1 << 64 * s) - 1)
        value ^= (high << 4 * s) ^ (high << 3 * s) ^ (high << s) ^ high
        length = value.bit_length()
    return value


class Crc64:
    """Go's crc64.New(crc64.MakeTable(crc64.ISO)): reflected, initial and final value all ones.
    Kept unreflected: the register is init * x^n + message * x^64 mod P, n the message's bits."""

    def __init__(self) -> None:
        self._register = _ONES

    def update(self, data: bytes) -> None:
        if data:
            message = int.from_bytes(data.translate(_REVERSED_BITS), "big")
            self._register = _reduce((self._register << 8 * len(data)) ^ (message << 64))

    def digest(self) -> bytes:
        """8 bytes, big-endian, as Go's Sum(nil)."""
        return (int(f"{self._register:064b}"[::-1], 2) ^ _ONES).to_bytes(8, "big")


class TarSplit:
    """The JSON lines of one tar, fed in the tar's order: raw bytes (`raw`) and each entry's
    content (`file`, after its header's raw bytes)."""

    def __init__(self) -> None:
        self._lines: list[bytes] = []
        self._raw: list[bytes] = []

    def raw(self, data: bytes) -> None:
        """Tar bytes that are no entry's content (headers, padding, the end blocks)."""
        if data:
            self._raw.append(data)

    def file(self, name: str, size: int, crc: bytes | None) -> None:
        """An entry's content: its header's name (as Go's tar reader gives it), size and CRC-64."""
        self._flush()
        entry: dict[str, object] = {"type": FILE}
        try:
            name.encode("utf-8")
            entry["name"] = name
        except UnicodeEncodeError:  # tar-split's name_raw, for names that are not UTF-8
            entry["name_raw"] = base64.b64encode(name.encode("utf-8", "surrogateescape")).decode()
        if size:
            entry["size"] = size
        entry["payload"] = base64.b64encode(crc).decode() if crc else None
        self._add(entry)

    def document(self) -> bytes:
        """The whole tar-split, uncompressed: the raw bytes fed since the last file its last segment,
        then the empty one that tar-split's disassembler ends with (what followed the end blocks)."""
        self._flush()
        return b"".join(self._lines) + self._line({"type": SEGMENT, "payload": "", "position": len(self._lines)})

    def _flush(self) -> None:
        if self._raw:
            self._add({"type": SEGMENT, "payload": base64.b64encode(b"".join(self._raw)).decode()})
            self._raw = []

    def _add(self, entry: dict[str, object]) -> None:
        entry["position"] = len(self._lines)
        self._lines.append(self._line(entry))

    @staticmethod
    def _line(entry: dict[str, object]) -> bytes:
        return json.dumps(entry, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
