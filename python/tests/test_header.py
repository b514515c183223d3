"""The Python mirror of include/anyreduce/anyreduce.h matches the header: function table,
argument types, enums, struct layouts, constants and initializers. No library, torch or GPU
needed."""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char_p, c_float, c_int, c_longlong, c_size_t, c_uint, c_void_p

import pytest

from anyreduce import _library, _types
from anyreduce._types import (
    ANYR_CONFIG_UNDEF_INT,
    Algo,
    DataType,
    PeerMemory,
    Quant,
    RedOp,
    Result,
    UniqueId,
    Wire,
    anyrConfig_t,
    anyrCounters_t,
    anyrFusedOptions_t,
    anyrTuneOptions_t,
)

# C type (as normalized by _header.norm_type) -> the ctypes type the binding must use.
C_TO_CTYPES = {
    "int": c_int,
    "int*": POINTER(c_int),
    "float": c_float,
    "size_t": c_size_t,
    "size_t*": POINTER(c_size_t),
    "void*": c_void_p,
    "void**": POINTER(c_void_p),
    "char*": c_char_p,
    "anyrResult_t": c_int,
    "anyrResult_t*": POINTER(c_int),
    "anyrComm_t": c_void_p,
    "anyrComm_t*": POINTER(c_void_p),
    "anyrUniqueId": UniqueId,
    "anyrUniqueId*": POINTER(UniqueId),
    "anyrConfig_t*": POINTER(anyrConfig_t),
    "anyrFusedOptions_t*": POINTER(anyrFusedOptions_t),
    "anyrCounters_t*": POINTER(anyrCounters_t),
    "anyrDataType_t": c_int,
    "anyrRedOp_t": c_int,
    "anyrAlgo_t": c_int,
    "anyrAlgo_t*": POINTER(c_int),
    "cudaStream_t": c_void_p,
    "long long": c_longlong,
    "char**": POINTER(c_char_p),
    "anyrPeerMemory_t": c_int,
    "anyrTuneOptions_t*": POINTER(anyrTuneOptions_t),
}

ENUMS = {
    "anyrResult_t": Result,
    "anyrDataType_t": DataType,
    "anyrRedOp_t": RedOp,
    "anyrAlgo_t": Algo,
    "anyrQuant_t": Quant,
    "anyrWire_t": Wire,
    "anyrPeerMemory_t": PeerMemory,
}


def test_every_header_function_is_in_the_table_and_vice_versa(header):
    declared = header.declared_function_names()
    assert len(declared) >= 20, "header parse found too few functions"
    assert len(set(declared)) == len(declared), "a function is declared twice"
    table = [f.name for f in _library.FUNCTIONS]
    assert len(set(table)) == len(table), "a function appears twice in the table"
    assert sorted(set(declared) - set(table)) == [], "declared in anyreduce.h, missing from the table"
    assert sorted(set(table) - set(declared)) == [], "in the table, not declared in anyreduce.h"
    # The fused functions are in both, even while the library may not define them yet.
    assert {"anyrAllReduceAddRmsNorm", "anyrAddRmsNorm"} <= set(table)


def test_table_argument_and_result_types_match_the_prototypes(header):
    protos = header.prototypes()
    assert set(protos) == set(header.declared_function_names())
    for f in _library.FUNCTIONS:
        p = protos[f.name]
        for ctype in [p.restype] + [t for t, _ in p.params]:
            assert ctype in C_TO_CTYPES, f"{f.name}: no ctypes mapping for C type {ctype!r}"
        assert f.restype is C_TO_CTYPES[p.restype], f"{f.name}: result type"
        want = [C_TO_CTYPES[t] for t, _ in p.params]
        assert len(f.argtypes) == len(want), f"{f.name}: {len(f.argtypes)} args, header has {len(want)}"
        for i, (got, exp, (ctype, pname)) in enumerate(zip(f.argtypes, want, p.params)):
            assert got is exp, f"{f.name} argument {i} ({ctype} {pname}): bound as {got}"


def test_table_comments_quote_each_prototype():
    """Each table entry has its C prototype quoted in a comment just above it."""
    import inspect

    src = inspect.getsource(_library)
    for f in _library.FUNCTIONS:
        entry = src.index(f'Function("{f.name}"')
        comment_block = src[:entry].rsplit("Function(", 1)[-1]
        assert f" {f.name}(" in comment_block and "#" in comment_block, \
            f"no quoted prototype above the table entry of {f.name}"


def test_only_the_new_fused_functions_are_lazy():
    lazy = sorted(f.name for f in _library.FUNCTIONS if f.lazy)
    assert lazy == ["anyrAddRmsNorm", "anyrAllReduceAddRmsNorm"]


@pytest.mark.parametrize("c_enum", sorted(ENUMS))
def test_enum_mirrors_header(header, c_enum):
    entries = header.enums()[c_enum]
    py = ENUMS[c_enum]
    seen = set()
    for name, value in entries:
        if name in _types.NUM_SENTINELS:
            assert value == len(py), f"{name} = {value}, but {py.__name__} has {len(py)} members"
            continue
        member = py.from_c_name(name)
        assert int(member) == value, f"{name} = {value}, {py.__name__}.{member.name} = {int(member)}"
        assert member.c_name == name
        seen.add(member)
    assert seen == set(py), f"{py.__name__} has members the header lacks: {set(py) - seen}"


def test_all_enums_of_the_header_are_mirrored(header):
    assert set(header.enums()) == set(ENUMS)


def test_algo_short_names_match_header_comment(header):
    # Each anyrAlgo_t enumerator's comment starts with its short name (what anyrAlgoName gives).
    import re

    m = re.search(r"typedef\s+enum\s*\{(.*?)\}\s*anyrAlgo_t\s*;", header.text, re.S)
    assert m, "anyrAlgo_t not found"
    quoted = dict(re.findall(r'(anyrAlgo\w+)\s*=\s*\d+\s*,\s*/\*\s*"([a-z0-9-]+)"', m.group(1)))
    values = [name for name, _ in header.enums()["anyrAlgo_t"] if name not in _types.NUM_SENTINELS]
    assert sorted(quoted) == sorted(values), "an enumerator's comment does not start with its name"
    for algo in Algo:
        assert quoted[algo.c_name] == algo.short_name, f"{algo.c_name}: header says {quoted[algo.c_name]!r}"
    assert len(set(quoted.values())) == len(quoted), "two algorithms share a short name"


STRUCT_FIELD_TYPES = {"size_t": c_size_t, "unsigned int": c_uint, "int": c_int}


@pytest.mark.parametrize("c_struct,py_struct", [("anyrConfig_t", anyrConfig_t),
                                                ("anyrFusedOptions_t", anyrFusedOptions_t)])
def test_struct_layout_mirrors_header(header, c_struct, py_struct):
    fields = header.structs()[c_struct]
    py_fields = py_struct._fields_
    assert [f[0] for f in fields] == [f[0] for f in py_fields], "field names/order differ"
    for (name, ctype, arr), (_, pytype) in zip(fields, py_fields):
        assert arr is None
        expected = c_void_p if ctype.endswith("*") else STRUCT_FIELD_TYPES[ctype]
        assert pytype is expected, f"{c_struct}.{name}: C {ctype}, bound as {pytype}"


def test_unique_id_layout(header):
    fields = header.structs()["anyrUniqueId"]
    assert len(fields) == 1 and fields[0][1] == "char"
    n = header.eval(fields[0][2])
    assert n == _types.ANYR_UNIQUE_ID_BYTES == ctypes.sizeof(UniqueId) == 128


@pytest.mark.parametrize("name", ["ANYR_MAJOR", "ANYR_MINOR", "ANYR_PATCH", "ANYR_VERSION_CODE",
                                  "ANYR_UNIQUE_ID_BYTES", "ANYR_CONFIG_UNDEF_INT",
                                  "ANYR_CONFIG_UNDEF_SIZE", "ANYR_CONFIG_MAGIC", "ANYR_FUSED_MAGIC"])
def test_constants_mirror_header(header, name):
    assert header.eval(header.defines()[name]) == getattr(_types, name)


def test_package_version_follows_header(header):
    import anyreduce

    d = header.defines()
    want = "%d.%d.%d" % (header.eval(d["ANYR_MAJOR"]), header.eval(d["ANYR_MINOR"]),
                         header.eval(d["ANYR_PATCH"]))
    assert anyreduce.__version__ == want


def _initializer_values(header, macro, struct):
    values = []
    for expr in header.initializer(macro):
        if expr.startswith("sizeof("):
            assert expr == f"sizeof({struct.__name__})"
            values.append(ctypes.sizeof(struct))
        else:
            values.append(header.eval(expr))
    return values


def test_config_initializer_mirrors_header(header):
    want = _initializer_values(header, "ANYR_CONFIG_INITIALIZER", anyrConfig_t)
    c = anyrConfig_t.initializer()
    got = [getattr(c, name) or 0 for name, _ in anyrConfig_t._fields_]  # NULL -> None -> 0
    assert got == want
    # An empty Config is exactly the initializer: every field "undefined", so env vars apply.
    from anyreduce import Config

    e = Config().to_c()
    assert [getattr(e, n) or 0 for n, _ in anyrConfig_t._fields_] == want


def test_fused_options_initializer_mirrors_header(header):
    want = _initializer_values(header, "ANYR_FUSED_OPTIONS_INITIALIZER", anyrFusedOptions_t)
    o = anyrFusedOptions_t.initializer()
    got = [getattr(o, name) or 0 for name, _ in anyrFusedOptions_t._fields_]  # NULL -> None -> 0
    assert got == want


def test_config_fields_map_onto_the_struct():
    from anyreduce import Config

    c = Config(algorithm="twoshot", timeout_ms=1234, one_shot_max_bytes=1 << 16,
               two_shot_max_bytes=1 << 20, chunk_bytes=1 << 22, use_nccl=False,
               max_blocks=7, fused_cluster=4).to_c()
    assert (c.algorithm, c.timeoutMs, c.oneShotMaxBytes, c.twoShotMaxBytes, c.chunkBytes,
            c.useNccl, c.maxBlocks, c.fusedCluster) == (int(Algo.TWO_SHOT), 1234, 1 << 16, 1 << 20,
                                                        1 << 22, 0, 7, 4)


def test_config_wire_and_host_algorithms():
    from anyreduce import Config, InvalidArgument

    assert Config(wire="fp8").to_c().wire == int(Wire.FP8)
    assert Config(wire=Wire.INT8).to_c().wire == 2
    assert Config(algorithm="host-oneshot").to_c().algorithm == int(Algo.HOST_ONE_SHOT)
    assert str(Algo.HOST_TWO_SHOT) == "host-twoshot"
    assert Config(algorithm="host-copy").to_c().algorithm == int(Algo.HOST_COPY) == 8
    with pytest.raises(InvalidArgument, match="config.wire"):
        Config(wire="fp4").to_c()


def test_config_peer_memory():
    from anyreduce import Config, InvalidArgument

    assert Config().to_c().peerMemory == ANYR_CONFIG_UNDEF_INT
    assert Config(peer_memory="vmm").to_c().peerMemory == int(PeerMemory.VMM) == 3
    assert Config(peer_memory="cuda-ipc").to_c().peerMemory == 2
    assert Config(peer_memory=PeerMemory.NONE).to_c().peerMemory == 0
    assert str(PeerMemory.CUDA_IPC) == "cuda-ipc"
    with pytest.raises(InvalidArgument, match="config.peer_memory"):
        Config(peer_memory="posix").to_c()


def test_counters_struct_mirrors_header(header):
    # anyrCounters_t has 2-D arrays the generic struct parser does not read: check the field
    # order against the header text and the size against the C layout rules.
    import re

    end = header.text.find("} anyrCounters_t;")
    assert end > 0, "anyrCounters_t not found in the header"
    body = header.text[:end].rsplit("typedef struct {", 1)[1]
    text = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    names = re.findall(r"(\w+)\s*(?:\[[^\]]*\])*\s*;", text)
    assert names == [f[0] for f in anyrCounters_t._fields_]
    assert "[anyrNumAlgos][ANYR_COUNTER_BUCKETS]" in text
    algos, buckets = len(Algo), _types.ANYR_COUNTER_BUCKETS
    assert "fusedLaunchesByCluster[4]" in text
    assert ctypes.sizeof(anyrCounters_t) == 16 + 2 * algos * buckets * 8 + 4 * 8 + 4 * 8
    m = re.search(r"#define ANYR_COUNTERS_MAGIC (0x[0-9a-fA-F]+)u", header.text)
    assert m and int(m.group(1), 16) == _types.ANYR_COUNTERS_MAGIC
    m = re.search(r"#define ANYR_COUNTER_BUCKETS (\d+)", header.text)
    assert m and int(m.group(1)) == buckets


def test_tune_options_mirror_header(header):
    # anyrTuneOptions_t: field order and types (the progress callback as anyrTuneProgress_t),
    # the magic, and ANYR_TUNE_OPTIONS_INITIALIZER.
    fields = header.structs()["anyrTuneOptions_t"]
    py_fields = anyrTuneOptions_t._fields_
    assert [f[0] for f in fields] == [f[0] for f in py_fields], "field names/order differ"
    for (name, ctype, arr), (_, pytype) in zip(fields, py_fields):
        assert arr is None
        if ctype == "anyrTuneProgress_t":
            assert pytype is _types.anyrTuneProgress_t
            continue
        expected = c_void_p if ctype.endswith("*") else STRUCT_FIELD_TYPES[ctype]
        assert pytype is expected, f"anyrTuneOptions_t.{name}: C {ctype}, bound as {pytype}"
    assert header.eval(header.defines()["ANYR_TUNE_MAGIC"]) == _types.ANYR_TUNE_MAGIC
    want = _initializer_values(header, "ANYR_TUNE_OPTIONS_INITIALIZER", anyrTuneOptions_t)
    o = anyrTuneOptions_t.initializer()
    got = [getattr(o, n) for n, _ in anyrTuneOptions_t._fields_]
    got = [0 if v is None else (ctypes.cast(v, c_void_p).value or 0) if n == "progress" else v
           for v, (n, _) in zip(got, anyrTuneOptions_t._fields_)]
    assert got == want
