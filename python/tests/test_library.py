"""Calls into a built libanyreduce.so that need no GPU: version, unique ids, argument errors
with the library's messages, configuration fields reaching the library, and "no GPU" coming
back as a clear error. Skipped (with the reason) when no library is built."""

from __future__ import annotations

import ctypes

import pytest

from conftest import have_gpu_device_nodes


def test_loads_the_library_under_test(ar, lib_path):
    import os

    assert os.path.realpath(ar.library_path()) == os.path.realpath(lib_path)


def test_every_required_function_is_exported(ar):
    from anyreduce import _library

    lib = ar.library()
    for f in _library.FUNCTIONS:
        if not f.lazy:
            assert lib.has_function(f.name), f.name


def test_version(ar, header):
    d = header.defines()
    want = tuple(header.eval(d[k]) for k in ("ANYR_MAJOR", "ANYR_MINOR", "ANYR_PATCH"))
    assert ar.version_info() == want
    assert ar.version() == "%d.%d.%d" % want
    assert ar.version_code() == header.eval(d["ANYR_VERSION_CODE"]) == ar.ANYR_VERSION_CODE


def test_unique_id_is_128_bytes_and_fresh(ar):
    a, b = ar.get_unique_id(), ar.get_unique_id()
    assert isinstance(a, bytes) and len(a) == 128 == ar.UNIQUE_ID_BYTES
    assert a != b, "two unique ids are equal (the secret should be random)"
    assert any(a), "unique id is all zeros"


def test_unique_id_shared_through_a_file(ar, tmp_path):
    path = tmp_path / "uid"
    mine = ar.share_unique_id(path, 0)
    assert len(mine) == 128 and path.read_bytes() == mine
    assert path.stat().st_mode & 0o777 == 0o600, "the id holds the secret: owner only"
    assert ar.share_unique_id(str(path), 1, timeout_s=1) == mine
    assert list(tmp_path.iterdir()) == [path], "the temporary file was left behind"
    with pytest.raises(TimeoutError, match=r"rank 2: rank 0 wrote no unique id to .*missing"):
        ar.share_unique_id(tmp_path / "missing", 2, timeout_s=0.05)
    (tmp_path / "short").write_bytes(b"abc")
    with pytest.raises(ValueError, match="holds 3 bytes, not a unique id"):
        ar.share_unique_id(tmp_path / "short", 1, timeout_s=1)
    with pytest.raises(ValueError, match="argument 'rank'"):
        ar.share_unique_id(path, -1)
    with pytest.raises(ValueError, match="argument 'timeout_s'"):
        ar.share_unique_id(path, 1, timeout_s=0)


def test_nranks_zero_is_invalid_argument_naming_nranks(ar):
    with pytest.raises(ar.InvalidArgument, match="nranks") as ei:
        ar.Comm.init_rank(0, ar.get_unique_id(), 0)
    e = ei.value
    assert isinstance(e, ValueError)
    assert e.code == ar.Result.INVALID_ARGUMENT
    assert e.message.startswith("anyrCommInitRank")  # the library's own message
    assert "argument 'nranks'" in e.message


def test_nranks_above_the_limit_names_nranks_and_the_limit(ar):
    with pytest.raises(ar.InvalidArgument, match="nranks") as ei:
        ar.Comm.init_rank(1025, ar.get_unique_id(), 0)
    assert "out of range 1..1024" in ei.value.message


def test_rank_out_of_range_names_rank(ar):
    with pytest.raises(ar.InvalidArgument, match="argument 'rank'"):
        ar.Comm.init_rank(2, ar.get_unique_id(), 5)


def test_garbage_unique_id_is_rejected_by_the_library(ar):
    with pytest.raises(ar.InvalidArgument, match="unique id"):
        ar.Comm.init_rank(1, bytes(128), 0)


def test_wrong_length_unique_id_is_rejected_before_the_call(ar):
    with pytest.raises(ar.InvalidArgument, match="128 bytes"):
        ar.Comm.init_rank(2, b"short", 0)
    with pytest.raises(ar.InvalidArgument, match="unique_id"):
        ar.Comm.init_rank(2, "not bytes", 0)


def test_from_nccl_null_is_invalid_argument(ar):
    with pytest.raises(ar.InvalidArgument, match="ncclComm"):
        ar.Comm.from_nccl(0)


@pytest.mark.parametrize("field,value,c_name", [
    ("algorithm", 99, "config.algorithm"),
    ("timeout_ms", -5, "config.timeoutMs"),
    ("one_shot_max_bytes", 1 << 40, "config.oneShotMaxBytes"),
    ("chunk_bytes", 1000, "config.chunkBytes"),
    ("use_nccl", 5, "config.useNccl"),
    ("max_blocks", 1000, "config.maxBlocks"),
    ("fused_cluster", 3, "config.fusedCluster"),
])
def test_each_config_field_reaches_the_library(ar, field, value, c_name):
    """A bad value in one Config field comes back from the library naming that C field:
    proves the field lands at the right offset of anyrConfig_t (the library checks the
    configuration before touching CUDA, so this needs no GPU)."""
    with pytest.raises(ar.InvalidArgument, match=c_name.replace(".", r"\.")):
        ar.Comm.init_rank(1, ar.get_unique_id(), 0, ar.Config(**{field: value}))


def test_config_struct_size_and_magic_are_accepted(ar):
    """A default Config passes the library's size/magic check (the failure, if any, comes
    later: from CUDA on a machine without GPU)."""
    try:
        comm = ar.Comm.init_rank(1, ar.get_unique_id(), 0, ar.Config(timeout_ms=5000))
    except ar.AnyreduceError as e:
        assert "config" not in e.message, e.message
        assert not isinstance(e, ar.InvalidArgument), e.message
    else:
        comm.close()


def test_config_with_bad_magic_is_refused(ar):
    from anyreduce._types import anyrConfig_t

    raw = anyrConfig_t.initializer()
    raw.magic = 0
    with pytest.raises(ar.InvalidArgument, match="ANYR_CONFIG_INITIALIZER"):
        ar.Comm.init_rank(1, ar.get_unique_id(), 0, raw)


def test_no_gpu_is_a_clear_error_not_a_crash(ar):
    """Creating a communicator where there is no GPU raises AnyreduceError carrying the
    library's CUDA message; with a GPU, a 1-rank communicator works."""
    uid = ar.get_unique_id()
    if have_gpu_device_nodes():
        try:
            comm = ar.Comm.init_rank(1, uid, 0)
        except ar.CudaError as e:  # device nodes but no usable CUDA (driver/runtime mismatch)
            assert e.code == ar.Result.CUDA_ERROR and e.message.startswith("anyrCommInitRank")
            pytest.skip(f"GPU device nodes exist but CUDA is not usable here: {e.message}")
        # Any other AnyreduceError is a failure of the 1-rank init itself: it propagates.
        with comm:
            assert (comm.count, comm.rank) == (1, 0)
            assert isinstance(comm.explain(), dict)
        assert comm.closed
        return
    with pytest.raises(ar.AnyreduceError) as ei:
        ar.Comm.init_rank(1, uid, 0)
    e = ei.value
    assert isinstance(e, ar.CudaError), f"expected anyrCudaError, got {e!r}"
    assert e.code == ar.Result.CUDA_ERROR
    assert "CUDA" in e.message and e.message.startswith("anyrCommInitRank")
    assert ar.last_error() == e.message  # the thread's last error is the same message
    # In words: no driver (or no GPU), not CUDA's "driver version is insufficient".
    assert "no NVIDIA driver was found" in e.message or "found no GPU" in e.message, e.message
    assert "insufficient" not in e.message, e.message


def test_check_devices_says_why_there_is_no_gpu(ar):
    """anyreduce.check_devices(): on a machine without NVIDIA device nodes, the same words as
    communicator init; with a GPU, the number of GPUs this build runs on."""
    if have_gpu_device_nodes():
        try:
            assert ar.check_devices() >= 1
        except ar.AnyreduceError as e:
            pytest.skip(f"GPU device nodes exist but this build cannot run here: {e.message}")
        return
    with pytest.raises(ar.CudaError) as ei:
        ar.check_devices()
    m = ei.value.message
    assert m.startswith("anyrCheckDevices: "), m
    assert "no NVIDIA driver was found" in m or "found no GPU" in m, m


def test_algo_names_agree_with_the_library(ar):
    known = 0
    for algo in ar.Algo:
        name = ar.algo_name(algo)
        if name is None:  # a library older than the header does not know newer algorithms
            continue
        known += 1
        assert name == algo.short_name
    assert known >= 5
    assert ar.algo_name(1000) is None


def test_error_strings(ar):
    assert ar.error_string(ar.Result.SUCCESS) == "no error"
    assert ar.error_string(ar.Result.TIMEOUT) == "timed out"
    for r in ar.Result:
        assert ar.error_string(r)


def test_closed_comm_is_invalid_usage(ar):
    comm = ar.Comm.__new__(ar.Comm)  # a closed communicator without a GPU
    comm._lib, comm._handle, comm._info = ar.library(), None, {}
    comm._all_reduce = comm._lib.anyrAllReduce
    assert comm.closed and repr(comm) == "<anyreduce.Comm closed>"
    with pytest.raises(ar.InvalidUsage, match="closed"):
        comm.all_reduce(0, 0, 1, "bf16")
    with pytest.raises(ar.InvalidUsage):
        comm.count
    comm.close()  # idempotent


def test_fused_functions_bind_lazily(ar):
    lib = ar.library()
    for name, call in [
        ("anyrAddRmsNorm", lambda: ar.add_rms_norm(0, 0, 0, 0, 1e-6, 0, 1, 128, "bf16")),
    ]:
        if lib.has_function(name):
            # Defined: NULL pointers come back as the library's argument error (or CUDA
            # error without a GPU), never a crash.
            with pytest.raises(ar.AnyreduceError) as ei:
                call()
            assert ei.value.message
        else:
            with pytest.raises(ar.FunctionNotAvailable, match=name) as ei:
                call()
            assert ei.value.code == ar.Result.UNSUPPORTED
            assert isinstance(ei.value, NotImplementedError)
            assert lib.path in str(ei.value)


def test_library_errors_keep_the_thread_message(ar):
    with pytest.raises(ar.InvalidArgument) as ei:
        ar.Comm.init_rank(-3, ar.get_unique_id(), 0)
    assert ar.last_error() == ei.value.message
    # ctypes passes plain ints for pointers; a NULL out-pointer is the library's to report.
    lib = ar.library()
    assert lib.anyrGetVersion(None) == int(ar.Result.INVALID_ARGUMENT)
    assert "version" in lib.last_error()
    v = ctypes.c_int()
    assert lib.anyrGetVersion(ctypes.byref(v)) == 0 and v.value == ar.ANYR_VERSION_CODE


def test_a_call_that_records_no_message_does_not_inherit_a_stale_one(ar):
    """If a failing call leaves no message of its own, the error must not show the message of
    an earlier, unrelated failure still held by anyrGetLastError."""
    with pytest.raises(ar.InvalidArgument, match="nranks"):
        ar.Comm.init_rank(0, ar.get_unique_id(), 0)  # leaves "anyrCommInitRank: ... nranks"
    lib = ar.library()
    msg = lib.message_for(int(ar.Result.INVALID_ARGUMENT), "anyrAddRmsNorm")
    assert msg.startswith("anyrAddRmsNorm: invalid argument")
    assert "nranks" not in msg
    if lib.has_function("anyrAddRmsNorm"):
        with pytest.raises(ar.InvalidArgument) as ei:
            ar.add_rms_norm(0, 0, 0, 0, 1e-6, 0, 1, 100, "bf16")  # hidden 100: not allowed
        assert ei.value.message.startswith("anyrAddRmsNorm")
        assert "nranks" not in ei.value.message


def test_sizes_beyond_size_t_are_refused_not_wrapped(ar):
    # ctypes would pass 2**64 + 4096 as 4096, a valid hidden size.
    with pytest.raises(ar.InvalidArgument, match="argument 'hidden'") as ei:
        ar.add_rms_norm(0, 0, 0, 0, 1e-6, 0, 1, 2**64 + 4096, "bf16")
    assert "does not fit a size_t" in ei.value.message
    with pytest.raises(ar.InvalidArgument, match="argument 'tokens'"):
        ar.add_rms_norm(0, 0, 0, 0, 1e-6, 0, -1, 4096, "bf16")
    with pytest.raises(ar.InvalidArgument, match="argument 'tokens'"):
        ar.add_rms_norm(0, 0, 0, 0, 1e-6, 0, 1.5, 4096, "bf16")


def test_from_nccl_takes_an_address_not_any_object(ar):
    with pytest.raises(ar.InvalidArgument, match="argument 'ncclComm'"):
        ar.Comm.from_nccl("abc")
