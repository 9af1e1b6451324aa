"""A warm run decodes the hooks' struct layouts and attach types without bcc: what it decodes
must be what bcc would (gatewrap.bpf.layout, loader.HOOKS), on the layouts of this build."""

from __future__ import annotations

import ctypes as ct
import json
import os

import pytest

from gatewrap.bpf import loader
from gatewrap.bpf.bccimport import import_bcc
from gatewrap.bpf.layout import ctype_of
from gatewrap.errors import BpfError
from gatewrap.sandbox import cgroup

pytestmark = pytest.mark.kernel


def _shape(t):
    """Size, alignment and every field's name, offset and size, recursively."""
    if hasattr(t, "_fields_"):
        return (ct.sizeof(t), ct.alignment(t),
                [(f[0], getattr(t, f[0]).offset, getattr(t, f[0]).size, _shape(f[1])) for f in t._fields_])
    if hasattr(t, "_length_"):
        return ("array", t._length_, _shape(t._type_))
    return t.__name__


@pytest.fixture(scope="module")
def layouts():
    loader.load_or_reuse(cgroup.parent_dir()).close()
    with open(os.path.join(loader.LAYOUT_DIR, f"{loader.sources_hash()}.json")) as f:
        return json.load(f)


def test_every_cached_layout_decodes_as_bcc_decodes_it(layouts):
    bcc = import_bcc()
    assert set(layouts) == {*loader.LAYOUT_MAPS, "gw_folds.key"}
    for name, desc in layouts.items():
        ours, theirs = ctype_of(desc), bcc.BPF._decode_table_type(desc)
        assert _shape(ours) == _shape(theirs), name
        assert ct.sizeof(ours) > 0


def test_the_attach_types_are_bccs_where_bcc_names_them():
    bcc = import_bcc()
    names = {"gw_connect4": "CGROUP_INET4_CONNECT", "gw_connect6": "CGROUP_INET6_CONNECT",
             "gw_sendmsg4": "CGROUP_UDP4_SENDMSG", "gw_sendmsg6": "CGROUP_UDP6_SENDMSG",
             "gw_sock_create": "CGROUP_INET_SOCK_CREATE", "gw_skb_egress": "CGROUP_INET_EGRESS",
             "gw_setsockopt": "CGROUP_SETSOCKOPT"}
    for prog, _, at in loader.HOOKS:
        if prog in names:
            assert at == int(getattr(bcc.BPFAttachType, names[prog])), prog
    assert {p for p, _, _ in loader.HOOKS} - set(names) == set(loader.OPTIONAL_HOOKS)


def test_a_layout_with_a_form_gatewrap_does_not_decode_is_refused():
    with pytest.raises(BpfError, match="cannot decode"):
        ctype_of(["s", [["x", "__int128"]], "struct"])
    with pytest.raises(BpfError, match="cannot decode"):
        ctype_of(["s", [["bits", "unsigned int", 3]], "struct"])  # a bit field
