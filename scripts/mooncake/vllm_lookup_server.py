#!/usr/bin/env python3
"""A lookup server that builds keys and asks the store the way vLLM's
MooncakeStoreConnector worker does, for `cargo xtask calibrate`.

Written from spec/wire.md ("What the server computes"): a pyzmq REP socket takes
`tagged-blob` lookups; for each full block of `block_size` tokens it builds one key
per rank namespace in Python,

    {model}@tp_rank:{t}@pcp0@dcp0@pp_rank:0@group:0@{hash.hex()}

asks the real Mooncake master about all of them in one `batch_is_exist` call of the
C++ client, and answers the leading run of blocks whose every key answered 1, times
the block size (the last prompt token always recomputed). A store error answers 0.
Anything that is not a well-formed lookup answers 0 too (the calibration sends none).

Usage: vllm_lookup_server.py --master HOST:PORT --endpoint URL --model NAME
                             [--block-size 16] [--namespaces 1]

Prints "ready" on stdout once the store client is set up and the socket bound; exits
on SIGTERM or when stdin closes. Needs the mooncake wheel (scripts/mooncake/install.sh)
and pyzmq in the same interpreter.
"""

import argparse
import os
import struct
import sys
import threading

# The C++ library logs to stdout: keep a private duplicate for "ready".
PROTO = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)

import zmq  # noqa: E402
from mooncake.store import MooncakeDistributedStore  # noqa: E402


def keys_of(model, namespaces, hashes):
    """Every key of every block, block-major, as vLLM's worker builds them."""
    keys = []
    for h in hashes:
        hexed = h.hex()
        for t in range(namespaces):
            keys.append(f"{model}@tp_rank:{t}@pcp0@dcp0@pp_rank:0@group:0@{hexed}")
    return keys


def answer(store, model, namespaces, block_size, frames):
    if len(frames) != 4 or frames[0] != b"lookup" or len(frames[1]) != 4 or len(frames[2]) != 2:
        return 0
    num_tokens = struct.unpack(">I", frames[1])[0]
    hash_len = struct.unpack(">H", frames[2])[0]
    blob = frames[3]
    if hash_len == 0 or len(blob) % hash_len:
        return 0
    hashes = [blob[i:i + hash_len] for i in range(0, len(blob), hash_len)]
    blocks = min(len(hashes), num_tokens // block_size)
    if blocks == 0:
        return 0
    keys = keys_of(model, namespaces, hashes[:blocks])
    try:
        found = store.batch_is_exist(keys)
    except Exception:  # a store error is a miss (spec/wire.md, step 5)
        return 0
    run = 0
    while run < blocks and all(r == 1 for r in found[run * namespaces:(run + 1) * namespaces]):
        run += 1
    hit = run * block_size
    if hit >= num_tokens:
        hit = min(run, (num_tokens - 1) // block_size) * block_size
    return hit


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--master", required=True)
    p.add_argument("--endpoint", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--namespaces", type=int, default=1)
    args = p.parse_args()
    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", args.master)
    if rc != 0:
        print(f"store setup failed: {rc}", file=sys.stderr)
        return 1
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REP)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(args.endpoint)
    # Stop when the parent closes our stdin.
    threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
    PROTO.write("ready\n")
    PROTO.flush()
    while True:
        frames = sock.recv_multipart()
        hit = answer(store, args.model, args.namespaces, args.block_size, frames)
        sock.send(struct.pack(">I", hit))


if __name__ == "__main__":
    sys.exit(main())
