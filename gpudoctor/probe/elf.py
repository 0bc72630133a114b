"""The dynamic section of an ELF shared library, read the way the loader reads it: no tool, no loading.

    dynamic_info("/.../libcudnn.so.9") -> {"soname": "libcudnn.so.9", "needed": [...], "rpath": None,
                                           "runpath": "$ORIGIN"}   (None when the file is not a readable ELF)

Only the program headers are used (PT_LOAD maps DT_STRTAB's address to a file offset, PT_DYNAMIC holds the
entries), as ld.so does: section headers may be stripped. Reads are bounded: cuDNN's libraries are hundreds of
megabytes, of which a few kilobytes are read.
"""

from __future__ import annotations

import struct

DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 5, 10, 14, 15, 29
PT_LOAD, PT_DYNAMIC = 1, 2
MAX_PHNUM = 256
MAX_DYNAMIC_BYTES = 64 * 1024
MAX_STRTAB_BYTES = 16 * 1024 * 1024


def dynamic_info(path: str) -> dict | None:
    try:
        with open(path, "rb") as fh:
            return _read(fh)
    except (OSError, struct.error, ValueError, UnicodeDecodeError):
        return None


def _read(fh) -> dict | None:
    ident = fh.read(16)
    if len(ident) < 16 or ident[:4] != b"\x7fELF" or ident[4] not in (1, 2) or ident[5] not in (1, 2):
        return None
    wide = ident[4] == 2
    end = "<" if ident[5] == 1 else ">"
    if wide:
        header = struct.unpack(end + "HHIQQQIHHHHHH", fh.read(48))
        phoff, phentsize, phnum = header[4], header[8], header[9]
    else:
        header = struct.unpack(end + "HHIIIIIHHHHHH", fh.read(36))
        phoff, phentsize, phnum = header[4], header[8], header[9]
    if not phoff or phnum > MAX_PHNUM:
        return None
    loads, dynamic = [], None
    for i in range(phnum):
        fh.seek(phoff + i * phentsize)
        if wide:
            p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack(end + "IIQQQQ", fh.read(40))
        else:
            p_type, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack(end + "IIIII", fh.read(20))
        if p_type == PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == PT_DYNAMIC:
            dynamic = (p_offset, min(p_filesz, MAX_DYNAMIC_BYTES))
    if dynamic is None:
        return None
    fh.seek(dynamic[0])
    raw = fh.read(dynamic[1])
    size = 16 if wide else 8
    entries = []
    for i in range(0, len(raw) - size + 1, size):
        tag, value = struct.unpack(end + ("qQ" if wide else "iI"), raw[i : i + size])
        if tag == DT_NULL:
            break
        entries.append((tag, value))
    strtab = next((v for t, v in entries if t == DT_STRTAB), None)
    strsz = next((v for t, v in entries if t == DT_STRSZ), None)
    offset = next((off + strtab - va for va, off, sz in loads if strtab is not None and va <= strtab < va + sz), None)
    if offset is None or not strsz:
        return None
    fh.seek(offset)
    table = fh.read(min(strsz, MAX_STRTAB_BYTES))

    def text(at: int) -> str:
        stop = table.find(b"\0", at)
        return table[at : stop if stop >= 0 else len(table)].decode("utf-8", "replace")

    def first(tag: int) -> str | None:
        return next((text(v) for t, v in entries if t == tag and v < len(table)), None)

    return {
        "soname": first(DT_SONAME),
        "needed": [text(v) for t, v in entries if t == DT_NEEDED and v < len(table)],
        "rpath": first(DT_RPATH),
        "runpath": first(DT_RUNPATH),
    }
