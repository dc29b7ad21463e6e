"""Symbols a loaded library does not export, found in its symbol table: the address must be the one the dynamic
linker gives for the same symbol where it is exported, or nothing is found at all."""

from __future__ import annotations

import ctypes
import os
import sys

import pytest
import torch

from ddpfaults.rank import native, torch_private

LIBTORCH = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
#: exported by libtorch_cpu, a function of AOTInductor's C shim (a stable C ABI, so its name does not change from
#: one torch to the next): the dynamic linker can say where it is
EXPORTED = b"aoti_torch_get_data_ptr"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF and /proc/self/maps: Linux only")


def _exported_address(library: str, name: bytes) -> int:
    return ctypes.cast(ctypes.CDLL(library, mode=os.RTLD_NOLOAD)[name.decode()], ctypes.c_void_p).value


def test_an_exported_function_is_found_where_the_dynamic_linker_has_it():
    found = native.symbols(LIBTORCH, [EXPORTED])
    assert found[EXPORTED].address == _exported_address(LIBTORCH, EXPORTED)
    assert found[EXPORTED].kind == native.STT_FUNC and found[EXPORTED].size > 0


@pytest.mark.skipif(
    torch_private._public_reset() is not None, reason="torch resets the flight record itself (_reset_fr_trace)"
)
@pytest.mark.skipif(
    tuple(map(int, torch.__version__.split(".")[:2])) < (2, 13),
    reason="libtorch defines no FlightRecorder::reset_all before 2.13 (2.8 and 2.9 measured): warm worlds retire",
)
def test_the_flight_recorders_hidden_pointer_and_reset_are_found_inside_libtorch():
    """What :func:`ddpfaults.rank.torch_private.reset_flight_record` calls: not exported (the dynamic linker cannot
    find them), listed in the symbol table as an 8-byte object and a function, both inside libtorch_cpu's mapping."""
    found = native.symbols(LIBTORCH, [torch_private._RECORDER, torch_private._RESET_ALL])
    for name in (torch_private._RECORDER, torch_private._RESET_ALL):
        with pytest.raises(AttributeError):
            _exported_address(LIBTORCH, name)
    start = native.load_address(LIBTORCH)
    assert found[torch_private._RECORDER][1:] == (8, native.STT_OBJECT)
    assert found[torch_private._RESET_ALL].kind == native.STT_FUNC
    assert all(start < found[name].address < start + os.path.getsize(LIBTORCH) * 2 for name in found)


def test_a_name_the_table_lacks_or_a_library_not_loaded_finds_nothing(tmp_path):
    assert native.symbols(LIBTORCH, [b"_ZN4c10d10no_such_symbolEv"]) == {}
    copy = tmp_path / "libnot_loaded.so"
    copy.write_bytes(b"\x7fELF\x02\x01" + bytes(100))
    assert native.load_address(str(copy)) is None
    assert native.symbols(str(copy), [EXPORTED]) == {}


@pytest.mark.parametrize(
    "content",
    [
        b"not an ELF file\n" * 10,
        b"\x7fELF\x01\x01" + bytes(200),  # 32-bit
        b"\x7fELF\x02\x01" + bytes(200),  # no section headers
        # section headers said to start 1 MB in (e_shoff at 0x28), 5 of 64 bytes (e_shentsize, e_shnum at 0x3A)
        b"\x7fELF\x02\x01" + bytes(0x22) + (10**6).to_bytes(8, "little") + bytes(10) + b"\x40\x00\x05\x00",
        b"",
    ],
    ids=["text", "elf32", "no-sections", "headers-past-the-end", "empty"],
)
def test_a_loaded_file_that_is_not_a_whole_elf64_library_finds_nothing(tmp_path, monkeypatch, content):
    library = tmp_path / "libodd.so"
    library.write_bytes(content)
    monkeypatch.setattr(native, "load_address", lambda path: 0x1000)
    assert native.symbols(str(library), [EXPORTED]) == {}
