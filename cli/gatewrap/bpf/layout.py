"""ctypes types of the C structs the hooks share with Python, from bcc's description of them.

When bcc compiles the hooks (the cold path), the loader caches bcc's JSON description of
each map's key or leaf struct (``bpf_table_leaf_desc``: ``[name, [[field, type], [field,
type, [n]], ...], "struct" | "struct_packed" | "union"]``, a nested struct or union in place
of a type name). :func:`ctype_of` turns one back into a ctypes type the way bcc's
``BPF._decode_table_type`` does, so that a warm run never loads bcc (libbcc, linked with LLVM
and clang, takes ~50 ms to load). tests/kernel/test_bpf_layout.py checks that both give the same
layout for every cached description.
"""

from __future__ import annotations

import ctypes as ct
from typing import Any

from ..errors import BpfError

#: C type names as bcc prints them, for the types gate.h uses (fixed-width __u8.. __u64 are
#: typedefs of these on every Linux ABI; bcc's str2ctype table for the names).
C_TYPES: dict[str, Any] = {
    "char": ct.c_char,
    "signed char": ct.c_byte,
    "unsigned char": ct.c_ubyte,
    "short": ct.c_short,
    "unsigned short": ct.c_ushort,
    "int": ct.c_int,
    "unsigned int": ct.c_uint,
    "long": ct.c_long,
    "unsigned long": ct.c_ulong,
    "long long": ct.c_longlong,
    "unsigned long long": ct.c_ulonglong,
    "_Bool": ct.c_bool,
}

_KINDS = {"struct": (ct.Structure, None), "struct_packed": (ct.Structure, 1), "union": (ct.Union, None)}


def ctype_of(desc: Any) -> Any:
    """The ctypes type of one bcc type description (a C type name or a struct/union list).

    Anonymous members (``""``) are named ``__anon0``, ``__anon1``... and listed in
    ``_anonymous_``, as bcc does, so their fields read as the outer struct's.

    Raises:
        BpfError: a form gate.h does not use (a bit field, a type name not in
            :data:`C_TYPES`): the hooks' sources and this decoder disagree.
    """
    if isinstance(desc, str):
        try:
            return C_TYPES[desc]
        except KeyError:
            raise BpfError(f"the hooks' struct layout uses C type {desc!r}, which gatewrap cannot decode") from None
    name, members = desc[0], desc[1]
    kind = desc[2] if len(desc) > 2 else "struct"
    if kind not in _KINDS:
        raise BpfError(f"the hooks' struct layout has an unknown kind {kind!r} ({name})")
    fields: list[tuple[str, Any]] = []
    anon: list[str] = []
    for m in members:
        if len(m) == 2:
            fields.append((m[0], ctype_of(m[1])))
        elif len(m) == 3 and isinstance(m[2], list) and len(m[2]) == 1:
            fields.append((m[0], ctype_of(m[1]) * m[2][0]))
        elif len(m) == 3 and m[2] in _KINDS:  # a nested struct or union: [name, members, kind]
            member = m[0] or f"__anon{len(anon)}"
            if not m[0]:
                anon.append(member)
            fields.append((member, ctype_of(m)))
        else:
            raise BpfError(f"the hooks' struct layout has a member gatewrap cannot decode: {m!r} ({name})")
    base, pack = _KINDS[kind]
    body: dict[str, Any] = {"_anonymous_": anon, "_fields_": fields}
    if pack is not None:
        body["_pack_"] = pack
    return type(str(name), (base,), body)
