"""Import bcc's Python bindings from Debian's ``python3-bpfcc`` package.

bcc's bindings are pure Python over ``libbcc.so.0`` (ctypes), installed by Debian under
``/usr/lib/python3/dist-packages/bcc``. The PyPI package named "bcc" is unrelated. So that
a virtualenv or another CPython 3.x can use Debian's copy without putting the whole of
Debian's dist-packages on ``sys.path`` (which would shadow the project's own
dependencies), :func:`import_bcc` loads just that one package from its directory.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType

#: Where Debian's python3-bpfcc puts the package (``dpkg -L python3-bpfcc``).
DEBIAN_BCC_DIRS = ("/usr/lib/python3/dist-packages/bcc",)


class BccMissing(RuntimeError):
    """bcc's Python bindings are not installed; the message says how to get them."""


def find_debian_bcc() -> str | None:
    """Return the directory of Debian's bcc package, or None when it is absent."""
    for d in DEBIAN_BCC_DIRS:
        if os.path.isfile(os.path.join(d, "__init__.py")):
            return d
    return None


def import_bcc() -> ModuleType:
    """Return the ``bcc`` module, loading Debian's copy by path when a plain import fails.

    Raises:
        BccMissing: neither an importable ``bcc`` nor Debian's package is present.
    """
    if "bcc" in sys.modules:
        return sys.modules["bcc"]
    try:
        return importlib.import_module("bcc")
    except ImportError:
        pass
    d = find_debian_bcc()
    if d is None:
        raise BccMissing(
            "bcc's Python bindings are missing: install Debian's package with "
            "'apt-get install python3-bpfcc' (not 'pip install bcc', an unrelated project)"
        )
    spec = importlib.util.spec_from_file_location(
        "bcc", os.path.join(d, "__init__.py"), submodule_search_locations=[d]
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bcc"] = mod
    try:
        spec.loader.exec_module(mod)
    except Exception as e:  # libbcc.so.0 missing or incompatible
        del sys.modules["bcc"]
        raise BccMissing(f"bcc's Python bindings at {d} failed to load: {e}") from e
    return mod
