#!/usr/bin/env python3
"""Writes the seed corpora of the bootstrap and config fuzz targets (tests/fuzz/corpus/).

Run from the repository root after a wire-format change: python3 tests/fuzz/make_seeds.py
The topology seeds are the fixtures (tests/fixtures/*.json), copied as they are.
"""
import hashlib
import hmac
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def write(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- bootstrap_message: header (src/bootstrap/message.h) [+ payload] -------------------------
MAGIC, VERSION = 0x414E5942, 2


def header(typ, rank, nranks, length, magic=MAGIC, version=VERSION):
    return struct.pack(">IHHIII", magic, version, typ, rank, nranks, length)


def reason(code, text):
    return struct.pack(">I", code) + text.encode()


# The fuzz target's fixed session key (fuzz_bootstrap_message.cc) and bootstrap/auth.h's message
# MAC, so that some seeds open as authenticated messages. Direction 1: from rank 0.
FUZZ_KEY = bytes(0x30 + i for i in range(32))


def sealed(typ, rank, nranks, payload, seq=0, direction=1):
    h = header(typ, rank, nranks, len(payload))
    mac = hmac.new(FUZZ_KEY, b"anyreduce bootstrap v2 message" + bytes([direction]) +
                   struct.pack(">Q", seq) + h + payload, hashlib.sha256).digest()
    return h + payload + mac


NONCE = bytes(range(32))
MAC = bytes(range(0x80, 0xA0))
write("bootstrap_message", "hello", header(1, 1, 2, 32) + NONCE)
write("bootstrap_message", "challenge", header(7, 0, 2, 64) + NONCE + MAC)
write("bootstrap_message", "proof", header(8, 1, 2, 32) + MAC)
write("bootstrap_message", "proof_short", header(8, 1, 2, 31) + MAC[:31])
write("bootstrap_message", "welcome", sealed(2, 0, 8, b""))
write("bootstrap_message", "reject", header(3, 0, 4, 16) + reason(4, "wrong secret"))
write("bootstrap_message", "gather", sealed(4, 3, 4, b"\x01" * 8))
write("bootstrap_message", "gather_all", sealed(5, 0, 4096, bytes(range(64))))
write("bootstrap_message", "abort", sealed(6, 0, 2, reason(7, "rank 1 timed out")))
write("bootstrap_message", "abort_bad_mac", sealed(6, 0, 2, reason(7, "forged"))[:-1] + b"\0")
write("bootstrap_message", "bad_magic", header(1, 0, 2, 0, magic=0x47455420))  # "GET "
write("bootstrap_message", "bad_version", header(1, 0, 2, 0, version=1))
write("bootstrap_message", "rank_out_of_range", header(4, 2, 2, 0))
write("bootstrap_message", "length_too_big", header(4, 0, 2, (64 << 20) + 1))
write("bootstrap_message", "truncated", header(1, 0, 2, 0)[:11])


# ---- unique id (src/bootstrap/unique_id.h), 128 bytes ----------------------------------------
def fnv1a(b):
    h = 2166136261
    for x in b:
        h ^= x
        h = (h * 16777619) & 0xFFFFFFFF
    return h


def unique_id(family, port, addr, scope=0):
    body = struct.pack(">IHBBHHI", 0x414E5549, 1, family, 0, port, 0, scope)
    body += addr.ljust(16, b"\0") + bytes(range(0x40, 0x60))
    body += struct.pack(">I", fnv1a(body))
    return body.ljust(128, b"\0")


write("bootstrap_message", "uid_ipv4", unique_id(4, 29500, bytes([127, 0, 0, 1])))
write("bootstrap_message", "uid_ipv6", unique_id(6, 29501, b"\0" * 15 + b"\1"))
write("bootstrap_message", "uid_ipv6_scope", unique_id(6, 40000, b"\xfe\x80" + b"\0" * 13 + b"\1", 2))
write("bootstrap_message", "uid_port0", unique_id(4, 0, bytes([10, 0, 0, 1])))

# ---- config_env: anyrConfig_t (80 bytes) + flags + NUL-separated values ----------------------
# anyrConfig_t on a 64-bit target: size, magic, version, algorithm, timeoutMs, oneShotMaxBytes,
# twoShotMaxBytes, chunkBytes, useNccl, maxBlocks, tuningFile (a pointer: the harness replaces
# it), tuneBudgetMs, wire, fusedCluster, 4 bytes of padding (fuzz_config_env.cc asserts the
# size). Variables in order: ANYR_ALGO, ANYR_TIMEOUT_MS, ANYR_ONESHOT_MAX_BYTES,
# ANYR_TWOSHOT_MAX_BYTES, ANYR_CHUNK_BYTES, ANYR_USE_NCCL, ANYR_MAX_BLOCKS, ANYR_FUSED_CLUSTER.
UNDEF_INT = -2147483648
UNDEF_SIZE = 0xFFFFFFFFFFFFFFFF
CONFIG_BYTES = 80


def config(algo=UNDEF_INT, timeout=UNDEF_INT, one=UNDEF_SIZE, two=UNDEF_SIZE, chunk=UNDEF_SIZE,
           nccl=UNDEF_INT, blocks=UNDEF_INT, budget=UNDEF_INT, wire=UNDEF_INT,
           cluster=UNDEF_INT):
    packed = struct.pack("<QIIiiQQQiiQiii4x", CONFIG_BYTES, 0x414E5952, 100, algo, timeout, one,
                         two, chunk, nccl, blocks, 0, budget, wire, cluster)
    assert len(packed) == CONFIG_BYTES
    return packed


def env(*values):
    return b"\0".join(v.encode() for v in values)


write("config_env", "defaults", config() + b"\x03")
write("config_env", "struct_fields",
      config(1, 5000, 1 << 20, 32 << 20, 8 << 20, 0, 16, 0, 1, 4) + b"\x03")
write("config_env", "env_values",
      config() + b"\x02" + env("twoshot", "10000", "256K", "64M", "16M", "1", "32", "8"))
write("config_env", "bad_env",
      config() + b"\x00" + env("bogus", "-1", "1Q", "", "1000", "2", "999", "3"))
write("config_env", "bad_struct", config(99, 0, 1 << 40, 0, 4097, 3, -1, -5, 7, 16) + b"\x03")
write("config_env", "size_text", b"64KiB")
write("config_env", "algo_text", b"oneshot-pull")
