"""Fixtures: vLLM 0.33's own lookup classes taken from its released wheel, and the
project's `lookup-server`.

vLLM is never imported (it needs torch and a GPU): `vllm_classes` reads the wheel
with `zipfile`, takes with `ast` only the lookup channel's code (`LookupKeyServer`,
`LookupKeyClient`, `get_zmq_rpc_path_lookup` from `store/worker.py`, the encoders of
`store/protocol.py`, the result types of `store/data.py`) and runs it with small
stand-ins for the imports it names (`envs`, `logger`, `make_zmq_socket`).

Environment: MOONCAKE_LOOKUP_VLLM_WHEEL (the wheel; default
<repo>/target/vllm-wheel/vllm-0.33.0-*.whl, fetched by scripts/python/test.sh),
LOOKUP_SERVER_BIN (default <CARGO_TARGET_DIR or repo/target>/debug/lookup-server),
MOONCAKE_MASTER_BIN (the real master, for `mooncake_master`; default
<repo>/.venv/bin/mooncake_master, from scripts/mooncake/install.sh).
"""

import ast
import glob
import os
import subprocess
import threading
import zipfile
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import zmq

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STORE = "vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/"
# What each source gives: the top-level names taken from it.
WANTED = {
    STORE + "data.py": ["BlobBlockHashes", "TailKeyBoundary", "MooncakeLookupResult"],
    STORE + "protocol.py": [
        "LOOKUP_MSG", "RESET_MSG", "RESP_OK", "RESP_ERR", "TAIL_KEY_BOUNDARY_ENTRY_SIZE",
        "encode_lookup_response", "decode_lookup_response",
    ],
    STORE + "worker.py": ["LookupKeyServer", "LookupKeyClient", "get_zmq_rpc_path_lookup"],
}
# Methods taken from a class of a source: (source, class) -> method names; each lands
# in the namespace as `Class_method`, a plain function to bind to a stand-in.
WANTED_METHODS = {
    (STORE + "worker.py", "MooncakeStoreWorker"): ["_tail_key_boundaries"],
}


def wheel_path():
    path = os.environ.get("MOONCAKE_LOOKUP_VLLM_WHEEL")
    if path:
        return path
    found = sorted(glob.glob(os.path.join(ROOT, "target", "vllm-wheel", "vllm-0.33.0-*.whl")))
    if not found:
        pytest.fail(
            "vLLM 0.33.0's wheel is missing: run scripts/python/test.sh (it downloads it into "
            "target/vllm-wheel) or set MOONCAKE_LOOKUP_VLLM_WHEEL"
        )
    return found[0]


def _nodes(source, names):
    """The top-level definitions and assignments of `names` in `source`."""
    tree = ast.parse(source)
    out = []
    for node in tree.body:
        name = None
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            name = node.name
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        if name in names:
            out.append(node)
    missing = set(names) - {getattr(n, "name", None) or _target(n) for n in out}
    assert not missing, f"vLLM 0.33.0's sources lack {sorted(missing)}"
    return out


def _methods(source, class_name, names):
    """The methods `names` of the top-level class `class_name` in `source`, renamed
    `{class_name}{name}`."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            out = [f for f in node.body if isinstance(f, ast.FunctionDef) and f.name in names]
            assert len(out) == len(names), f"vLLM 0.33.0's {class_name} lacks one of {names}"
            for f in out:
                f.name = class_name + f.name
            return out
    raise AssertionError(f"vLLM 0.33.0's sources lack class {class_name}")


def _target(node):
    t = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
    return t.id


class _Logger:
    """Stand-in for vLLM's logger: keeps what it was told."""

    def __init__(self):
        self.lines = []

    def _log(self, msg, *args):
        self.lines.append(msg % args if args else msg)

    debug = info = warning = error = _log


class _Envs:
    """Stand-in for `vllm.envs`: VLLM_RPC_BASE_PATH as vLLM reads it."""

    @property
    def VLLM_RPC_BASE_PATH(self):  # noqa: N802 - vLLM's name
        import tempfile

        return os.getenv("VLLM_RPC_BASE_PATH", tempfile.gettempdir())


def _make_zmq_socket(ctx, path, socket_type, bind=None, linger=None, **_):
    """Stand-in for `vllm.utils.network_utils.make_zmq_socket` for REQ/REP sockets
    (it sets buffer options only for other socket types)."""
    sock = ctx.socket(socket_type)
    if linger is not None:
        sock.setsockopt(zmq.LINGER, linger)
    if bind:
        sock.bind(path)
    else:
        sock.connect(path)
    return sock


@pytest.fixture(scope="session")
def vllm_classes():
    """vLLM 0.33.0's lookup channel classes, run from its wheel's sources."""
    return load_vllm_classes(wheel_path())


def load_vllm_classes(wheel):
    """The names of WANTED, run from `wheel`'s sources with the stand-ins."""
    import socket

    ns = {
        "__name__": "vllm_lookup_channel",
        "os": os, "socket": socket, "threading": threading, "zmq": zmq,
        "Future": Future, "ThreadPoolExecutor": ThreadPoolExecutor,
        "Sequence": Sequence, "dataclass": dataclass, "field": field,
        "BlockHash": bytes, "VllmConfig": object, "MooncakeStoreWorker": object,
        "envs": _Envs(), "logger": _Logger(), "make_zmq_socket": _make_zmq_socket,
        "cdiv": lambda a, b: -(a // -b), "ExternalCachedBlockPool": object,
    }
    with zipfile.ZipFile(wheel) as z:
        for name, wanted in WANTED.items():
            module = ast.Module(body=_nodes(z.read(name).decode(), wanted), type_ignores=[])
            exec(compile(module, f"vllm-0.33.0/{name}", "exec"), ns)  # noqa: S102
        for (name, cls), wanted in WANTED_METHODS.items():
            module = ast.Module(body=_methods(z.read(name).decode(), cls, wanted), type_ignores=[])
            exec(compile(module, f"vllm-0.33.0/{name}", "exec"), ns)  # noqa: S102
    names = [k for names in WANTED.values() for k in names]
    names += [cls + m for (_, cls), methods in WANTED_METHODS.items() for m in methods]
    # The logger stand-in too: what vLLM's code logged (its failure paths) can be read.
    return SimpleNamespace(**{k: ns[k] for k in names}, logger=ns["logger"])


def vllm_config(block_size=16, **extra):
    """The parts of a `VllmConfig` the lookup client reads."""
    return SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_connector_extra_config=dict(extra)),
        parallel_config=SimpleNamespace(data_parallel_index=0),
        cache_config=SimpleNamespace(block_size=block_size),
        model_config=SimpleNamespace(model="org/model"),
    )


class StoreWorker:
    """Stand-in for vLLM's `MooncakeStoreWorker` behind its `LookupKeyServer`: the
    store is a set of present block hashes; a lookup answers the leading run of
    present blocks among the prompt's full blocks, times the block size, a full hit
    cut below the prompt's end (`MooncakeStoreWorker.lookup`), with the tail-key
    boundaries of vLLM's own `MooncakeStoreWorker._tail_key_boundaries` (one
    full-attention KV-cache group, no partial hash hits)."""

    def __init__(self, classes, block_size, present=()):
        self.result_type = classes.MooncakeLookupResult
        self.boundaries = classes.MooncakeStoreWorker_tail_key_boundaries
        self.block_size = block_size
        self.hash_block_size = block_size
        self.present = set(present)
        self.kv_send_thread = None
        self.store = self
        self.lookups = 0
        # What vLLM's `_tail_key_boundaries` reads of the worker.
        self.token_dbs = [SimpleNamespace(block_size=block_size)]
        self._kv_cache_groups = [SimpleNamespace(kv_cache_spec=SimpleNamespace(prefix_cacheable=True))]
        self.coord = SimpleNamespace(enable_partial_hash_hits=False)

    def contains(self, group_id, block_hash):
        """`ExternalCachedBlockPool.contains`: one group, the present set."""
        return group_id == 0 and bytes(block_hash) in self.present

    def lookup(self, num_tokens, block_hashes):
        self.lookups += 1
        blocks = min(len(block_hashes), num_tokens // self.block_size)
        run = 0
        while run < blocks and bytes(block_hashes[run]) in self.present:
            run += 1
        hit = run * self.block_size
        if hit >= num_tokens:
            # vLLM's worker re-derives a full hit below the request end: the last
            # token is always recomputed.
            hit = min(run, (num_tokens - 1) // self.block_size) * self.block_size
        return self.result_type(hit, self.boundaries(self, block_hashes, hit, self))

    def remove_all(self, force=False):
        assert force
        self.present.clear()


@pytest.fixture
def rpc_base(tmp_path, monkeypatch):
    """A private VLLM_RPC_BASE_PATH: vLLM's ipc paths land in the test's dir."""
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", str(tmp_path))
    return tmp_path


def lookup_server_bin():
    path = os.environ.get("LOOKUP_SERVER_BIN")
    if not path:
        target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
        path = os.path.join(target, "debug", "lookup-server")
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} missing: build it with `cargo build -p lookup-cli --bin lookup-server`")
    return path


@pytest.fixture
def mooncake_master():
    """Starts the real `mooncake_master` with scripts/mooncake/start-master.sh; yields
    (its pid, its `host:port`); killed at the end if still running."""
    binary = os.environ.get("MOONCAKE_MASTER_BIN", os.path.join(ROOT, ".venv", "bin", "mooncake_master"))
    if not os.access(binary, os.X_OK):
        pytest.fail(f"{binary} missing: install it with `bash scripts/mooncake/install.sh`")
    out = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "mooncake", "start-master.sh")],
        env={**os.environ, "MOONCAKE_MASTER_BIN": binary},
        check=True, capture_output=True, text=True,
    ).stdout
    started = dict(part.split("=", 1) for part in out.split())
    pid = int(started["MOONCAKE_MASTER_PID"])
    yield pid, started["MOONCAKE_MASTER_ADDR"]
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


@pytest.fixture
def lookup_server(rpc_base, tmp_path):
    """Starts `lookup-server` at vLLM's ipc path for lookup_rpc_port 0, dp rank 0, with
    the given hex hashes preloaded, or answering from the Mooncake master at `master`
    (`host:port`); yields its endpoint."""
    import socket

    procs = []

    def start(present_hex, block_size=16, master=None):
        preload = tmp_path / "present.txt"
        preload.write_text("".join(h + "\n" for h in present_hex))
        index = ["--mooncake-master", master] if master else ["--preload", str(preload)]
        proc = subprocess.Popen(
            [lookup_server_bin(), "--base-path", str(rpc_base), "--hostname", socket.gethostname(),
             "--block-size", str(block_size), *index],
            stdout=subprocess.PIPE, text=True,
        )
        procs.append(proc)
        return proc.stdout.readline().strip()

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()
