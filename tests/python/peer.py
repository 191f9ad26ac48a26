#!/usr/bin/env python3
"""An independent peer of the lookup channel, written from spec/wire.md alone.

A pyzmq REQ client and REP server (as vLLM uses them), speaking both wire formats,
to check that the Rust client and server interoperate byte for byte. Needs pyzmq
(tested with pyzmq==27.3.0); MessagePack is encoded by hand, from the spec.

    peer.py serve --endpoint URL --block-size B [--present HEX,...] [--count N]
        REP server. Answers lookups of either format with the reference semantics
        (aligned tokens, leading run of present blocks, full-hit rule), a reset with
        0x01 (and forgets every block), anything else with 0x00. Prints one line per
        request: "request" and the hex of each frame. Exits after N requests.

    peer.py probe --endpoint URL --format tagged-blob|msgpack-hex --block-size B
                  --num-tokens N [--hashes HEX,...] [--timeout-s S]
        REQ client: one lookup. Prints "request" with the hex of each frame sent,
        "reply" with the hex of the reply frame, and "hit_tokens N".

    peer.py reset --endpoint URL [--timeout-s S]
        REQ client: one reset. Prints "reply HEX" and "ok" or "failed".

Exit status: 0 success, 1 timeout or bad reply, 2 usage.
"""

import argparse
import struct
import sys

import zmq


def encode_hex_array(hashes):
    """MessagePack array of lowercase-hex strings (spec/wire.md, msgpack-hex frame 1)."""
    out = bytearray()
    n = len(hashes)
    if n < 16:
        out.append(0x90 | n)
    elif n < 1 << 16:
        out += b"\xdc" + struct.pack(">H", n)
    else:
        out += b"\xdd" + struct.pack(">I", n)
    for h in hashes:
        s = h.hex().encode("ascii")
        m = len(s)
        if m < 32:
            out.append(0xA0 | m)
        elif m < 1 << 8:
            out += b"\xd9" + bytes([m])
        elif m < 1 << 16:
            out += b"\xda" + struct.pack(">H", m)
        else:
            out += b"\xdb" + struct.pack(">I", m)
        out += s
    return bytes(out)


def decode_hex_array(data):
    """Inverse of encode_hex_array; raises ValueError on anything else."""
    pos = 0

    def take(k):
        nonlocal pos
        if pos + k > len(data):
            raise ValueError("truncated")
        chunk = data[pos:pos + k]
        pos += k
        return chunk

    tag = take(1)[0]
    if tag & 0xF0 == 0x90:
        n = tag & 0x0F
    elif tag == 0xDC:
        n = struct.unpack(">H", take(2))[0]
    elif tag == 0xDD:
        n = struct.unpack(">I", take(4))[0]
    else:
        raise ValueError("not an array")
    hashes = []
    for _ in range(n):
        tag = take(1)[0]
        if tag & 0xE0 == 0xA0:
            m = tag & 0x1F
        elif tag == 0xD9:
            m = take(1)[0]
        elif tag == 0xDA:
            m = struct.unpack(">H", take(2))[0]
        elif tag == 0xDB:
            m = struct.unpack(">I", take(4))[0]
        else:
            raise ValueError("not a string")
        hashes.append(bytes.fromhex(take(m).decode("ascii")))
    if pos != len(data):
        raise ValueError("trailing bytes")
    return hashes


def encode_lookup(fmt, num_tokens, block_size, hashes):
    if fmt == "tagged-blob":
        hash_len = len(hashes[0]) if hashes else 0
        return [b"lookup", struct.pack(">I", num_tokens), struct.pack(">H", hash_len), b"".join(hashes)]
    token_len = num_tokens // block_size * block_size
    return [struct.pack(">I", token_len), encode_hex_array(hashes)]


def reference_hit(num_tokens, block_size, hashes, present):
    """spec/wire.md, "What the server computes", for one namespace."""
    def run_hit(limit):
        blocks = min(len(hashes), limit // block_size)
        run = 0
        while run < blocks and hashes[run] in present:
            run += 1
        return run * block_size

    if not hashes or num_tokens // block_size == 0:
        return 0
    hit = run_hit(num_tokens)
    if hit >= num_tokens:
        hit = run_hit(num_tokens - 1)
    return hit


def parse_hashes(text):
    return [bytes.fromhex(h.strip()) for h in text.split(",") if h.strip()] if text else []


def answer(frames, block_size, present):
    """The reply frame to one request (either format, detected as in spec/wire.md)."""
    if frames and frames[0] == b"lookup":
        try:
            if len(frames) != 4 or len(frames[1]) != 4 or len(frames[2]) != 2:
                raise ValueError("bad shape")
            num_tokens = struct.unpack(">I", frames[1])[0]
            hash_len = struct.unpack(">H", frames[2])[0]
            blob = frames[3]
            if hash_len == 0:
                if blob:
                    raise ValueError("hashes without a length")
                hashes = []
            else:
                if len(blob) % hash_len:
                    raise ValueError("ragged hashes")
                hashes = [blob[i:i + hash_len] for i in range(0, len(blob), hash_len)]
        except ValueError:
            return struct.pack(">I", 0)
        return struct.pack(">I", reference_hit(num_tokens, block_size, hashes, present))
    if len(frames) == 1 and frames[0] == b"reset":
        present.clear()
        return b"\x01"
    if len(frames) == 2 and len(frames[0]) == 4:
        try:
            hashes = decode_hex_array(frames[1])
        except ValueError:
            return struct.pack(">I", 0)
        token_len = struct.unpack(">I", frames[0])[0]
        return struct.pack(">I", reference_hit(token_len, block_size, hashes, present))
    return b"\x00"


def serve(args):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REP)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(args.endpoint)
    print("bound", args.endpoint, flush=True)
    present = set(parse_hashes(args.present))
    served = 0
    while args.count is None or served < args.count:
        frames = sock.recv_multipart()
        print("request", " ".join(f.hex() or "-" for f in frames), flush=True)
        sock.send(answer(frames, args.block_size, present))
        served += 1
    sock.close(0)
    ctx.term()
    return 0


def exchange(args, frames):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(args.endpoint)
    sock.send_multipart(frames)
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    if not poller.poll(int(args.timeout_s * 1000)):
        print(f"error: no reply from {args.endpoint} within {args.timeout_s} s", file=sys.stderr)
        sock.close(0)
        ctx.term()
        return None
    reply = sock.recv_multipart()
    sock.close(0)
    ctx.term()
    return reply


def probe(args):
    hashes = parse_hashes(args.hashes)
    frames = encode_lookup(args.format, args.num_tokens, args.block_size, hashes)
    print("request", " ".join(f.hex() or "-" for f in frames), flush=True)
    reply = exchange(args, frames)
    if reply is None:
        return 1
    print("reply", " ".join(f.hex() or "-" for f in reply), flush=True)
    if len(reply) != 1:
        print("error: reply has", len(reply), "frames", file=sys.stderr)
        return 1
    body = reply[0]
    ok_len = (len(body) >= 4 and (len(body) - 4) % 8 == 0) if args.format == "tagged-blob" else len(body) == 4
    if not ok_len:
        print("error: malformed reply of", len(body), "bytes", file=sys.stderr)
        return 1
    print("hit_tokens", struct.unpack(">I", body[:4])[0], flush=True)
    return 0


def reset(args):
    reply = exchange(args, [b"reset"])
    if reply is None:
        return 1
    print("reply", " ".join(f.hex() or "-" for f in reply), flush=True)
    if reply == [b"\x01"]:
        print("ok")
        return 0
    print("failed")
    return 1


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--endpoint", required=True)
    s.add_argument("--block-size", type=int, required=True)
    s.add_argument("--present", default="")
    s.add_argument("--count", type=int)
    p = sub.add_parser("probe")
    p.add_argument("--endpoint", required=True)
    p.add_argument("--format", choices=["tagged-blob", "msgpack-hex"], default="tagged-blob")
    p.add_argument("--block-size", type=int, required=True)
    p.add_argument("--num-tokens", type=int, required=True)
    p.add_argument("--hashes", default="")
    p.add_argument("--timeout-s", type=float, default=5.0)
    r = sub.add_parser("reset")
    r.add_argument("--endpoint", required=True)
    r.add_argument("--timeout-s", type=float, default=5.0)
    args = parser.parse_args()
    return {"serve": serve, "probe": probe, "reset": reset}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
