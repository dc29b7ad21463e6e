"""Addresses, in this process, of symbols a loaded shared library defines but does not export (Linux, ELF64).

A library built with hidden visibility still lists every symbol in its ``.symtab`` section (unless stripped):
the symbol's value is its address relative to where the library is loaded, which ``/proc/self/maps`` gives.
Nothing here calls anything: :mod:`ddpfaults.rank.flight` checks what it found before it does.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import NamedTuple

SECTION = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr: name type flags addr offset size link info addralign entsize
SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym: name info other shndx value size
SHT_SYMTAB = 2
STT_OBJECT, STT_FUNC = 1, 2


class Symbol(NamedTuple):
    """A symbol of a loaded library: its ``address`` in this process, its ``size`` in bytes, its ``kind``
    (:data:`STT_OBJECT`, :data:`STT_FUNC`, ...)."""

    address: int
    size: int
    kind: int


def load_address(path: str) -> int | None:
    """Where the library at ``path`` is mapped in this process (its mapping of file offset 0), or None."""
    real = os.path.realpath(path)
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].strip() == real and int(fields[2], 16) == 0:
                    return int(fields[0].split("-")[0], 16)
    except OSError:
        return None
    return None


def symbols(path: str, names: list[bytes]) -> dict[bytes, Symbol]:
    """The symbols of ``names`` (mangled, as bytes) that the loaded library at ``path`` lists in its symbol table;
    a name it does not list, a library that is not loaded, stripped, or not a little-endian ELF64 file: left out."""
    base = load_address(path)
    if base is None:
        return {}
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as image:
            return {name: Symbol(base + value, size, kind) for name, (value, size, kind) in _lookup(image, names)}
    except (OSError, ValueError, IndexError, struct.error):  # a file not laid out as its headers say
        return {}


def _lookup(image: mmap.mmap, names: list[bytes]):
    if image[:6] != b"\x7fELF\x02\x01":  # magic, 64-bit, little-endian
        return
    (table_at,) = struct.unpack_from("<Q", image, 0x28)
    entry_size, count = struct.unpack_from("<HH", image, 0x3A)
    sections = [SECTION.unpack_from(image, table_at + i * entry_size) for i in range(count)]
    tables = [s for s in sections if s[1] == SHT_SYMTAB]
    if not tables:
        return
    table = tables[0]
    if table[9] != SYMBOL.size:
        return
    strings = sections[table[6]]
    strings_at, strings_end = strings[4], strings[4] + strings[5]
    table_at, table_end, step = table[4], table[4] + table[5], table[9]
    for name in names:
        found = image.find(b"\0" + name + b"\0", strings_at, strings_end)
        if found < 0:
            continue
        key = struct.pack("<I", found + 1 - strings_at)  # the symbol's st_name: its offset in the string table
        at = image.find(key, table_at, table_end)
        while at >= 0 and (at - table_at) % step:  # the same 4 bytes inside another field of some symbol
            at = image.find(key, at + 1, table_end)
        if at >= 0:
            _, info, _, _, value, size = SYMBOL.unpack_from(image, at)
            yield name, (value, size, info & 0xF)
