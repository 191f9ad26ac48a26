"""mooncake_lookup.LookupKeyClient against vLLM 0.33.0's own LookupKeyServer and
LookupKeyClient (from its wheel, conftest.py) and against `lookup-server`."""

import hashlib
import logging
import multiprocessing
import os
import time

import pytest
import zmq

import mooncake_lookup
from conftest import StoreWorker, vllm_config

BS = 16


def h(i):
    """Block hash i: 32 bytes of value i (vLLM's sha256 hashes are 32 bytes)."""
    return bytes([i]) * 32


PRESENT = [h(1), h(2), h(3)]
# (num_tokens, block_hashes): full hit, partial hit, miss, no hashes, a prompt
# shorter than a block, a prompt ending on a block boundary.
CASES = [
    (4 * BS + 1, [h(1), h(2), h(3), h(4)]),
    (3 * BS + 5, [h(1), h(2), h(9)]),
    (2 * BS + 1, [h(7), h(8)]),
    (5, []),
    (BS - 1, [h(1)]),
    (2 * BS, [h(1), h(2)]),
]


def pairs(boundaries):
    """Tail-key boundaries as (group_id, num_tokens) pairs (vLLM's class and ours
    compare by value this way)."""
    return tuple((b.group_id, b.num_tokens) for b in boundaries)


# The hit and the tail-key boundaries vLLM 0.33's worker answers for each of CASES.
WANT = [
    (3 * BS, ((0, 3 * BS),)),
    (2 * BS, ((0, 2 * BS),)),
    (0, ()),
    (0, ()),
    (0, ()),
    (BS, ((0, BS),)),
]


def wait_ready(client, req_id, num_tokens, hashes, polls=10_000):
    """Polls with non_block=True until an answer; returns (answer, polls that were None)."""
    for n in range(polls):
        got = client.lookup(req_id, num_tokens, hashes, non_block=True)
        if got is not None:
            return got, n
        time.sleep(0.001)
    pytest.fail(f"{req_id}: no answer after {polls} polls")


@pytest.fixture
def vllm_server(vllm_classes, rpc_base):
    worker = StoreWorker(vllm_classes, BS, PRESENT)
    server = vllm_classes.LookupKeyServer(worker, vllm_config(BS))
    yield worker
    # Left open: vLLM's close() from another thread aborts libzmq while its server
    # thread blocks in recv (each test binds its own ipc path, in its own dir).
    server.running = False


def test_a_mistyped_lookup_key_is_named_in_a_warning(rpc_base, caplog):
    """kv_connector_extra_config is read leniently (vLLM's keys share it): a `lookup_*`
    key nobody reads is named in a warning; the known ones, vLLM's own among them, and
    keys of other names are not."""
    valid = dict(lookup_async=True, lookup_rpc_port=0, lookup_prefetch_limit=4,
                 lookup_timeout_s=1.0, lookup_endpoint="ipc:///tmp/unused-lookup",
                 store_tp_size=1, some_other_key=1)
    with caplog.at_level(logging.WARNING, logger="mooncake_lookup"):
        mooncake_lookup.LookupKeyClient(vllm_config(BS, **valid)).close()
        assert caplog.records == []
        mooncake_lookup.LookupKeyClient(vllm_config(
            BS, **valid, lookup_prefetch_limt=8, lookup_timeout=2)).close()
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert message.startswith(
        "kv_connector_extra_config: unknown key(s) lookup_prefetch_limt, lookup_timeout "
        "ignored (the lookup keys are: "), message
    assert "lookup_prefetch_limit, " in message and "lookup_timeout_s" in message


def test_endpoint_is_vllms(vllm_classes, rpc_base):
    cfg = vllm_config(BS, lookup_rpc_port=7)
    assert mooncake_lookup.endpoint_of(cfg) == vllm_classes.get_zmq_rpc_path_lookup(cfg)
    cfg.parallel_config.data_parallel_index = 3
    assert mooncake_lookup.endpoint_of(cfg) == vllm_classes.get_zmq_rpc_path_lookup(cfg)


def test_answers_equal_vllms_client_on_vllms_server(vllm_classes, vllm_server):
    ours = mooncake_lookup.LookupKeyClient(vllm_config(BS))
    theirs = vllm_classes.LookupKeyClient(vllm_config(BS))
    try:
        for i, (num_tokens, hashes) in enumerate(CASES):
            want = theirs.lookup(f"v{i}", num_tokens, hashes)
            got = ours.lookup(f"o{i}", num_tokens, hashes)
            assert (want.hit_length, pairs(want.tail_key_boundaries)) == WANT[i]
            assert (got.hit_length, pairs(got.tail_key_boundaries)) == WANT[i], (num_tokens, len(hashes))
            # Byte for byte: vLLM's encoder of our result is the reply its server sent.
            assert vllm_classes.encode_lookup_response(
                vllm_classes.MooncakeLookupResult(got.hit_length, got.tail_key_boundaries)
            ) == vllm_classes.encode_lookup_response(want)
        assert [ours.answer_of(f"o{i}").kind for i in range(len(CASES))] == [
            "hit", "hit", "miss", "not_needed", "not_needed", "hit"]
        assert ours.answer_of("o0") == mooncake_lookup.Answer("hit", 3 * BS, None)
    finally:
        ours.close()
        theirs.close()


def test_non_block_answers_none_then_the_result(vllm_server):
    ours = mooncake_lookup.LookupKeyClient(vllm_config(BS))
    try:
        assert ours.lookup("r", 4 * BS + 1, PRESENT, non_block=True) is None
        got, _ = wait_ready(ours, "r", 4 * BS + 1, PRESENT)
        assert got.hit_length == 3 * BS
        # Consumed: the next call starts a new lookup (vLLM pops its future).
        assert ours.lookup("r", 4 * BS + 1, PRESENT, non_block=True) is None
        ours.discard("r")
        assert ours._native.tracked_requests() == 0
        assert ours.answer_of("r") is None
    finally:
        ours.close()


def test_prefetch_sends_at_arrival_and_lookup_reads_it(vllm_server):
    ours = mooncake_lookup.LookupKeyClient(
        vllm_config(BS, lookup_prefetch_limit=4, lookup_prefetch_ttl_s=30.0))
    try:
        ours.prefetch("p", 4 * BS + 1, PRESENT)
        # Handed to the I/O thread at the next call; flush is the connector's, once a
        # scheduler step.
        ours.flush()
        for _ in range(10_000):
            if vllm_server.lookups == 1:
                break
            time.sleep(0.001)
        assert vllm_server.lookups == 1
        got, _ = wait_ready(ours, "p", 4 * BS + 1, PRESENT)
        assert got.hit_length == 3 * BS
        assert vllm_server.lookups == 1
        assert ours.stats()["rpcs_sent"] == 1
    finally:
        ours.close()


def thread_ids():
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def io_threads():
    """The thread ids of the drop-in's I/O runtime (named IO_THREAD_NAME; Linux keeps
    its first 15 bytes)."""
    name = mooncake_lookup._native.IO_THREAD_NAME[:15]
    tids = []
    for tid in thread_ids():
        with open(f"/proc/self/task/{tid}/comm") as f:
            if f.read().strip() == name:
                tids.append(tid)
    return tids


def test_io_threads_never_preempt_the_scheduler_thread(vllm_server):
    # SCHED_BATCH: the step's wake-up of the I/O task (flush) and the sends and
    # receives of libzmq's threads do not preempt the caller's thread at wake-up; the
    # nice value (their share of a busy CPU) is the caller's.
    before = thread_ids()
    ours = mooncake_lookup.LookupKeyClient(vllm_config(BS, lookup_prefetch_limit=4))
    try:
        ours.prefetch("p", 4 * BS + 1, PRESENT)
        ours.flush()
        wait_ready(ours, "p", 4 * BS + 1, PRESENT)
        # The runtime's threads (started by the process's first client), and the
        # threads this client started: libzmq's I/O thread and its reaper at least.
        runtime = io_threads()
        started = thread_ids() - before - set(runtime)
        assert len(runtime) >= 1 and len(started) >= 2, (runtime, started)
        tids = sorted(set(runtime) | started)
        assert [os.sched_getscheduler(t) for t in tids] == [os.SCHED_BATCH] * len(tids)
        nice = os.getpriority(os.PRIO_PROCESS, 0)
        assert [os.getpriority(os.PRIO_PROCESS, t) for t in tids] == [nice] * len(tids)
        assert os.sched_getscheduler(0) == os.SCHED_OTHER
    finally:
        ours.close()


def test_deferred_sends_wait_for_flush_or_a_second_poll(vllm_server):
    ours = mooncake_lookup.LookupKeyClient(
        vllm_config(BS, lookup_prefetch_limit=4, lookup_prefetch_ttl_s=30.0))
    try:
        ours.defer_sends(True)
        ours.prefetch("p", 4 * BS + 1, PRESENT)
        # A step: one poll of each waiting request, a first sight among them.
        assert ours.lookup("p", 4 * BS + 1, PRESENT, non_block=True) is None
        assert ours.lookup("q", 3 * BS + 5, PRESENT[:2] + [h(9)], non_block=True) is None
        time.sleep(0.2)
        assert vllm_server.lookups == 0, "nothing goes out before the step's flush"
        ours.flush()
        assert wait_ready(ours, "p", 4 * BS + 1, PRESENT)[0].hit_length == 3 * BS
        assert wait_ready(ours, "q", 3 * BS + 5, PRESENT[:2] + [h(9)])[0].hit_length == 2 * BS
        assert vllm_server.lookups == 2
        # Without a flush, a request polled twice hands over at its second poll.
        assert ours.lookup("r", 4 * BS + 1, PRESENT, non_block=True) is None
        time.sleep(0.2)
        assert vllm_server.lookups == 2
        got, polls = wait_ready(ours, "r", 4 * BS + 1, PRESENT)
        assert got.hit_length == 3 * BS
        assert polls >= 1
        assert vllm_server.lookups == 3
        assert ours.stats()["rpcs_sent"] == 3
    finally:
        ours.close()


def test_deferred_arrivals_are_applied_by_the_next_call(vllm_server):
    ours = mooncake_lookup.LookupKeyClient(
        vllm_config(BS, lookup_prefetch_limit=4, lookup_prefetch_ttl_s=30.0))
    try:
        ours.defer_sends(True)
        ours.prefetch("p", 4 * BS + 1, PRESENT)
        ours.prefetch("p", 4 * BS + 1, PRESENT)
        ours.prefetch("d", 4 * BS + 1, PRESENT)
        # A bad chain (its second hash a byte short) is not prefetched; its lookup
        # raises, as without deferral. The arrivals share one buffer: the chain after
        # it keeps its own hashes.
        ours.prefetch("bad", 4 * BS + 1, [h(1), b"yy"])
        ours.prefetch("q", 4 * BS + 1, [h(1), h(2), h(9), h(10)])
        ours.discard("d")
        assert ours.tracked_requests() == 2
        with pytest.raises(ValueError, match="different lengths"):
            ours.lookup("bad", 4 * BS + 1, [h(1), b"yy"], non_block=True)
        ours.flush()
        assert wait_ready(ours, "p", 4 * BS + 1, PRESENT)[0].hit_length == 3 * BS
        assert wait_ready(ours, "q", 4 * BS + 1, [h(1), h(2)])[0].hit_length == 2 * BS
        assert vllm_server.lookups == 2
        assert ours.tracked_requests() == 0
    finally:
        ours.close()


def test_reset_wipes_vllms_store(vllm_classes, vllm_server):
    ours = mooncake_lookup.LookupKeyClient(vllm_config(BS))
    try:
        assert ours.lookup("a", 4 * BS + 1, PRESENT).hit_length == 3 * BS
        assert ours.reset() is True
        assert vllm_server.present == set()
        assert ours.lookup("b", 4 * BS + 1, PRESENT).hit_length == 0
        assert ours.answer_of("b").kind == "miss"
    finally:
        ours.close()


def test_answers_equal_vllms_client_on_lookup_server(vllm_classes, lookup_server):
    """The same hits as vLLM's client; `lookup-server` sends no tail-key boundaries
    (vLLM's client reads none there), the drop-in answers vLLM's worker's."""
    endpoint = lookup_server([x.hex() for x in PRESENT])
    assert endpoint == mooncake_lookup.endpoint_of(vllm_config(BS))
    ours = mooncake_lookup.LookupKeyClient(vllm_config(BS))
    theirs = vllm_classes.LookupKeyClient(vllm_config(BS))
    try:
        for i, (num_tokens, hashes) in enumerate(CASES):
            want = theirs.lookup(f"v{i}", num_tokens, hashes)
            got = ours.lookup(f"o{i}", num_tokens, hashes)
            assert (want.hit_length, want.tail_key_boundaries) == (WANT[i][0], ())
            assert (got.hit_length, pairs(got.tail_key_boundaries)) == WANT[i], (num_tokens, len(hashes))
        assert theirs.reset() is True
        assert ours.lookup("after", 4 * BS + 1, PRESENT).hit_length == 0
    finally:
        ours.close()
        theirs.close()


def test_killed_master_behind_lookup_server_is_0_for_vllm_and_unavailable_for_ours(
        vllm_classes, lookup_server, mooncake_master):
    """spec/wire.md, "Store unavailable": with the real master killed behind
    `lookup-server`, vLLM 0.33's own client reads the server's error reply as 0 hit
    tokens (and its REQ socket keeps working), ours as unavailable within one call
    timeout of the master client (1 s), never as a miss."""
    import os
    import signal

    pid, addr = mooncake_master
    lookup_server([], master=addr)
    ours = mooncake_lookup.LookupKeyClient(vllm_config(BS))
    theirs = vllm_classes.LookupKeyClient(vllm_config(BS))
    try:
        # The master is up and holds nothing: a true miss for both.
        assert theirs.lookup("v0", 4 * BS + 1, PRESENT).hit_length == 0
        assert ours.lookup("o0", 4 * BS + 1, PRESENT).hit_length == 0
        assert ours.answer_of("o0") == mooncake_lookup.Answer("miss", 0, None)

        logged = len(vllm_classes.logger.lines)
        os.kill(pid, signal.SIGKILL)
        started = time.monotonic()
        got = ours.lookup("o1", 4 * BS + 1, PRESENT)
        took = time.monotonic() - started
        assert got.hit_length == 0
        assert ours.answer_of("o1") == mooncake_lookup.Answer("unavailable", 0, "store")
        assert took < 1.0, took
        for i in range(3):
            assert theirs.lookup(f"v{i + 1}", 4 * BS + 1, PRESENT) == vllm_classes.MooncakeLookupResult(0)
        # vLLM took its own failure path: decode_lookup_response raised, lookup() caught.
        failures = [line for line in vllm_classes.logger.lines[logged:] if "Invalid Mooncake lookup response" in line]
        assert len(failures) == 3, vllm_classes.logger.lines[logged:]
    finally:
        ours.close()
        theirs.close()


def test_lookup_endpoint_key_chooses_a_tcp_server(lookup_server):
    lookup_server([x.hex() for x in PRESENT])
    # The same server through the endpoint key (its ipc URL, given explicitly).
    endpoint = mooncake_lookup.endpoint_of(vllm_config(BS))
    ours = mooncake_lookup.LookupKeyClient(vllm_config(BS, lookup_endpoint=endpoint))
    try:
        assert ours.endpoint == endpoint
        assert ours.lookup("x", 4 * BS + 1, PRESENT).hit_length == 3 * BS
    finally:
        ours.close()


def test_tail_key_boundaries_name_every_group(vllm_server):
    """With two KV-cache groups (a hybrid model), one boundary per group, as vLLM's
    worker answers a whole-block hit; none for a miss."""
    ours = mooncake_lookup.LookupKeyClient(vllm_config(BS))
    ours.tail_key_groups = (0, 1)
    try:
        got = ours.lookup("g", 4 * BS + 1, PRESENT)
        assert (got.hit_length, pairs(got.tail_key_boundaries)) == (3 * BS, ((0, 3 * BS), (1, 3 * BS)))
        assert ours.lookup("m", 2 * BS + 1, [h(7), h(8)]).tail_key_boundaries == ()
    finally:
        ours.close()


def test_silent_server_is_unavailable_where_vllms_client_blocks(vllm_classes, rpc_base):
    """A server that takes requests and never answers (a hung worker): ours answers 0,
    unavailable, within lookup_timeout_s; vLLM's own lookup is still blocked after."""
    ctx = zmq.Context()
    silent = ctx.socket(zmq.ROUTER)
    silent.setsockopt(zmq.LINGER, 0)
    silent.bind(mooncake_lookup.endpoint_of(vllm_config(BS)))
    # vLLM's client in a child process: blocked forever, it is killed, not joined.
    blocked = multiprocessing.get_context("fork").Process(
        target=lambda: vllm_classes.LookupKeyClient(vllm_config(BS)).lookup(
            "v", 4 * BS + 1, PRESENT), daemon=True)
    blocked.start()
    ours = mooncake_lookup.LookupKeyClient(vllm_config(BS, lookup_timeout_s=0.3))
    try:
        got = ours.lookup("o", 4 * BS + 1, PRESENT)
        assert got.hit_length == 0
        assert ours.answer_of("o") == mooncake_lookup.Answer("unavailable", 0, "timed_out")
        blocked.join(1.0)
        assert blocked.is_alive() and blocked.exitcode is None
    finally:
        blocked.kill()
        blocked.join()
        ours.close()
        silent.close()
        ctx.term()


def test_dead_server_is_unavailable(rpc_base):
    """No server at the ipc path: unavailable (transport), never read as a miss."""
    ours = mooncake_lookup.LookupKeyClient(vllm_config(BS, lookup_timeout_s=0.3))
    try:
        assert ours.lookup("o", 4 * BS + 1, PRESENT).hit_length == 0
        assert ours.answer_of("o") == mooncake_lookup.Answer("unavailable", 0, "transport")
        ours.close()
        assert ours.lookup("c", 4 * BS + 1, PRESENT).hit_length == 0
        assert ours.answer_of("c").kind == "unavailable"
    finally:
        ours.close()


def test_bad_extra_config_is_a_value_error(rpc_base):
    with pytest.raises(ValueError, match="lookup_timeout_s"):
        mooncake_lookup.LookupKeyClient(vllm_config(BS, lookup_timeout_s=-1.0))
    with pytest.raises(ValueError):
        mooncake_lookup.LookupKeyClient(vllm_config(BS, lookup_mooncake_master="not-a-host"))


def test_hashes_of_other_buffers_and_bad_types(vllm_server):
    """bytearray hashes read as bytes; a hash of another length, a non-str request id
    or a non-buffer hash is an error, not a lookup."""
    ours = mooncake_lookup.LookupKeyClient(vllm_config(BS))
    try:
        got = ours.lookup("b", 4 * BS + 1, [bytearray(x) for x in PRESENT])
        assert got.hit_length == 3 * BS
        # The same answer, the same (read-only) result object.
        assert ours.lookup("c", 4 * BS + 1, PRESENT) is got
        with pytest.raises(ValueError, match="different lengths"):
            ours.lookup("d", 4 * BS + 1, [h(1), b"short"])
        with pytest.raises(TypeError):
            ours.lookup(7, 4 * BS + 1, PRESENT)
        with pytest.raises(TypeError):
            ours.lookup("e", 4 * BS + 1, ["not bytes"])
        assert ours.tracked_requests() == 0
    finally:
        ours.close()


class _HashSubclass(bytes):
    """A bytes subclass: not exactly `bytes`, so not read through CPython's layout."""


def test_hash_lists_of_other_items_are_read_as_their_bytes(vllm_server):
    """A list of exact `bytes` is read item by item through CPython's object layout
    (python/src/hashes.rs); a list with another item anywhere (a bytes subclass, a
    bytearray after bytes, a memoryview), a tuple, and an empty list take the general
    path. Each answers exactly what the same hashes as `bytes` answer: the present
    prefix (3 blocks) of 4 hashes, or nothing to ask for an empty list."""
    ours = mooncake_lookup.LookupKeyClient(vllm_config(BS))
    four = PRESENT + [h(9)]
    try:
        cases = {
            "exact": four,
            "subclass_last": four[:3] + [_HashSubclass(four[3])],
            "subclass_first": [_HashSubclass(four[0])] + four[1:],
            "bytearray_after_bytes": four[:2] + [bytearray(four[2]), four[3]],
            "memoryview": [memoryview(x) for x in four],
            "tuple": tuple(four),
        }
        got = {rid: ours.lookup(rid, 4 * BS + 1, hashes).hit_length
               for rid, hashes in cases.items()}
        assert got == {rid: 3 * BS for rid in cases}
        assert ours.lookup("empty", 4 * BS + 1, []).hit_length == 0
        assert ours.answer_of("empty").kind == "not_needed"
        # A length that differs after exact bytes is refused and leaves nothing held.
        with pytest.raises(ValueError, match="different lengths"):
            ours.lookup("longer_last", 4 * BS + 1, four[:3] + [four[3] + b"x"])
        assert ours.tracked_requests() == 0
    finally:
        ours.close()


def test_oversized_hashes_are_refused_not_copied(vllm_server):
    """A hash longer than 65,535 bytes, or more hash bytes than a lookup on the wire
    carries (65,536 hashes of at most 256 bytes: 16 MiB), is a ValueError naming the
    request: a list repeating one object costs Python 8 bytes an item, and the client
    must not reserve its total (python/src/hashes.rs). As a list of exact bytes, as a
    list read on the general path, and as a generator (no length, checked as it goes).
    The client answers the next lookup exactly."""
    ours = mooncake_lookup.LookupKeyClient(vllm_config(BS))
    huge = b"x" * 70_000
    many = 16 * 1024 * 1024 // 32 + 1
    try:
        with pytest.raises(ValueError, match="big: hash too long"):
            ours.lookup("big", 4 * BS + 1, [huge] * 4)
        for rid, hashes in (("many", [h(1)] * many),
                            ("many_general", [bytearray(h(1))] + [h(1)] * (many - 1)),
                            ("many_generator", (h(1) for _ in range(many)))):
            with pytest.raises(ValueError, match=f"{rid}: 16777248 bytes of block hashes"):
                ours.lookup(rid, 4 * BS + 1, hashes)
        assert ours.tracked_requests() == 0
        assert ours.lookup("after", 4 * BS + 1, PRESENT + [h(9)]).hit_length == 3 * BS
    finally:
        ours.close()


@pytest.mark.parametrize("defer", [False, True])
def test_hashes_of_many_requests_share_buffers_without_mixing(vllm_server, defer):
    """Requests' hashes are copied into buffers shared by several requests (64 KiB
    each): 300 requests of 64 hashes span 10 of them, a refused list between two
    requests leaves both theirs intact, and ending requests in another order than
    they came reads no other request's hashes. Each answer is exact: the present
    prefix of its own prompt."""
    ours = mooncake_lookup.LookupKeyClient(
        vllm_config(BS, lookup_prefetch_limit=400, lookup_prefetch_ttl_s=30.0))
    ours.defer_sends(defer)
    try:
        # Request i: its first (i % 4) blocks are present, then absent ones, chained
        # as vLLM's are (each hash covers its parent: equal last hashes, equal
        # prompts, one shared RPC, rule 16).
        def prompt(i):
            out = [h(1 + b) for b in range(i % 4)]
            while len(out) < 64:
                out.append(hashlib.sha256((out[-1] if out else b"") + bytes([i % 50])).digest())
            return out

        want = {f"r{i}": (i % 4) * BS for i in range(300)}
        for i in range(300):
            ours.prefetch(f"r{i}", 64 * BS + 1, prompt(i))
            if i % 50 == 7:
                with pytest.raises(ValueError, match="different lengths"):
                    ours.lookup(f"bad{i}", 4 * BS + 1, [h(1), b"short"], non_block=True)
            if i % 3 == 2:
                # An earlier request ends first: its buffer stays while others use it.
                ours.discard(f"r{i - 1}")
                del want[f"r{i - 1}"]
        ours.flush()
        got = {rid: wait_ready(ours, rid, 64 * BS + 1, None)[0].hit_length for rid in want}
        assert got == want
        assert ours.tracked_requests() == 0
    finally:
        ours.close()


def test_hash_buffers_are_reused_across_waves_at_the_defaults(vllm_server):
    """At the default settings, against vLLM's own lookup server: 4 waves of 40
    lookups of 64 hashes, each wave's prompts new, each wave submitted (non-blocking,
    as vLLM's scheduler probes) before any of its answers is read, so that a wave's
    requests span two 64 KiB buffers. A wave's requests have ended before the next
    starts, so the next writes its hashes into the buffers they left, a buffer filled
    before the current one included (python/src/hashes.rs); every answer is exact, the
    present prefix of its own prompt."""
    ours = mooncake_lookup.LookupKeyClient(vllm_config(BS))
    try:
        for wave in range(4):
            prompts, want = {}, {}
            for i in range(40):
                present = (wave + i) % 4
                prompt = [h(1 + b) for b in range(present)]
                while len(prompt) < 64:
                    prompt.append(hashlib.sha256(
                        (prompt[-1] if prompt else b"") + bytes([wave, i])).digest())
                rid = f"w{wave}-{i}"
                prompts[rid], want[rid] = prompt, present * BS
                first = ours.lookup(rid, 64 * BS + 1, prompt, non_block=True)
                assert first is None, f"{rid} answered at its submit"
            got = {rid: wait_ready(ours, rid, 64 * BS + 1, prompts[rid])[0].hit_length
                   for rid in prompts}
            assert got == want, f"wave {wave}"
    finally:
        ours.close()


def test_answers_kept_without_discard_are_bounded(rpc_base):
    """A caller that never discards (a router calling the blocking lookup) keeps at most
    65,536 last answers: the 65,537th answer drops the older half. After close every
    lookup answers at once, unavailable ("closed"), and its answer is kept like any."""
    ours = mooncake_lookup.LookupKeyClient(vllm_config(BS))
    ours.close()
    try:
        for i in range(70_000):
            assert ours.lookup(f"r{i}", 4 * BS + 1, PRESENT).hit_length == 0
        closed = mooncake_lookup.Answer("unavailable", 0, "closed")
        # Answers 0..65,536 were stored when the bound was passed: those below
        # 65,537 - 32,768 = 32,769 went, the rest and every later one stayed.
        assert [ours.answer_of(f"r{i}") for i in (0, 32_768)] == [None, None]
        assert [ours.answer_of(f"r{i}") for i in (32_769, 65_536, 69_999)] == [closed] * 3
        # A discarded answer goes at once, whatever its age.
        ours.discard("r69999")
        assert ours.answer_of("r69999") is None
    finally:
        ours.close()
