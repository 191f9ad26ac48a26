//! The native half of the Python package `mooncake_lookup`: `NativeClient`, one
//! [`LookupClient`] keyed by vLLM's string request ids, with vLLM's
//! `LookupKeyClient` semantics (`python/mooncake_lookup/__init__.py` derives the
//! endpoint from the `VllmConfig` and wraps it). Its parts: `hashes` (reading a
//! request's block hashes out of Python into chunks shared by requests), `arrivals`
//! (the prefetches deferred to the step's first call), `caller_id` (the per-id
//! table's key).
//!
//! # Threads
//!
//! The client's I/O task runs on one tokio runtime per process (`runtime`: one
//! worker thread, not a Python thread). Every call runs on the caller's Python
//! thread; the only waits (a blocking `lookup`, `reset`) release the GIL while they
//! sleep on the I/O task's reports.

mod arrivals;
mod caller_id;
mod hashes;

use std::collections::HashMap;
use std::sync::OnceLock;

use arrivals::Arrivals;
use bytes::Bytes;
use caller_id::CallerId;
use hashes::HashArena;
use lookup_core::Table;
use lookup_tokio::{
    Answer, BlockHashes, Deadline, KeyLayout, LookupClient, Probe, Request, RequestId,
    ResetOutcome, Unavailable,
};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyString;

/// The name of the runtime's threads (Linux shows its first 15 bytes).
const IO_THREAD_NAME: &str = "mooncake-lookup-io";

/// The process's runtime for every client's I/O task: one worker thread, started at
/// the first client. Its threads run under `SCHED_BATCH` (`lookup_tokio::io_thread`),
/// as do libzmq's (`NativeClient::new` connects on such a thread): the step's one
/// wake-up of the I/O task (`flush`) does not preempt the scheduler's thread at
/// wake-up; if the OS refuses, they run under the default policy.
fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name(IO_THREAD_NAME)
                .on_thread_start(|| {
                    let _ = lookup_tokio::io_thread::set_batch_policy();
                })
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start the lookup runtime: {e}")))
}

/// What the drop-in holds of one caller id: its lookup while one is held (announced,
/// not yet answered or dropped), and its last answer, kept until `discard`
/// (`answer_of`). One map entry for both, so that a poll costs one hash lookup and
/// the answering poll moves nothing between maps.
#[derive(Debug, Default)]
struct Slot {
    /// The request as the client knows it (numeric id, prompt, block hashes).
    request: Option<Request>,
    /// The last answer read.
    answer: Option<Answer>,
    /// With `defer_sends`: the hand-over (`NativeClient::handovers`) during which a
    /// non-blocking `lookup` last polled this request, so that a second poll before
    /// the next hand-over (a caller polling in a loop, not once per step) hands over
    /// itself. 0: never polled.
    polled_in: u64,
    /// When `answer` was stored: `NativeClient::answers` then (the oldest answers go
    /// first past [`ANSWERS_KEPT`]).
    answered: u64,
}

impl Slot {
    /// Keeps `answer` as the last one, numbered by `answers` (then counted).
    fn keep_answer(&mut self, answer: Answer, answers: &mut u64) {
        self.answer = Some(answer);
        self.answered = *answers;
        *answers += 1;
    }
}

/// Last answers kept for requests no longer held (read, not discarded), for
/// `answer_of`. vLLM's scheduler discards every request at its finish; a caller that
/// never does (a router calling the blocking `lookup`) would otherwise grow the
/// table by a slot (128 bytes) a request: past this many, the older half goes.
const ANSWERS_KEPT: usize = 65_536;

/// vLLM's `LookupKeyClient` over the Rust [`LookupClient`].
///
/// `NativeClient(transport, target, block_size, extra_config_json, model)`:
/// `transport` is `"zmq"` (`target` a ZeroMQ URL, `ipc://...` or `tcp://...`) or
/// `"direct"` (`target` the Mooncake master, `host:port` or `etcd://h1:p1;h2:p2`,
/// keys `{model}@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{hash hex}`); `block_size` in
/// tokens; `extra_config_json` vLLM's `kv_connector_extra_config` as JSON (lookup keys
/// read, others ignored: `KvConnectorExtraConfig`). `lookup_async` is always on in
/// the client: whether a call waits is chosen per call, as vLLM's `non_block` does.
///
/// Raises `ValueError` for a bad key, transport or address, `RuntimeError` when the
/// socket cannot be created.
#[pyclass(module = "mooncake_lookup._native")]
struct NativeClient {
    client: LookupClient,
    /// Builds the Python result of a hit length (`set_result_factory`); each hit
    /// length's result is built once and kept in `results`.
    result_factory: Option<Py<PyAny>>,
    results: HashMap<u32, Py<PyAny>>,
    /// Every caller id with a lookup held or a last answer kept. The core's table
    /// (foldhash): every poll hashes its id once, and SipHash's cost on a 40-byte
    /// vLLM id was a third of the ready poll's; keys inline ([`CallerId`]), so a
    /// probe compares the id in the bucket it read.
    slots: Table<CallerId, Slot>,
    /// Slots with a lookup held (`tracked_requests`).
    held: usize,
    next_id: u64,
    /// `set_defer_sends`: a non-blocking `lookup` leaves its new RPC for the next
    /// `flush` (or any other call) instead of waking the I/O thread itself.
    defer_sends: bool,
    /// With `defer_sends`: the arrivals (`prefetch`) not applied yet. The next call
    /// of any other kind applies them first, together, so a step's arrivals cost one
    /// pass of the client's code, not one cold call each, and every later call sees
    /// them as if applied at arrival.
    arrivals: Arrivals,
    /// Where every request's block hashes are copied (chunks shared by requests).
    hashes: HashArena,
    /// With `defer_sends`: the hand-overs of deferred RPCs so far plus one (`flush`,
    /// or a `lookup` that hands over); a slot's `polled_in` refers to it.
    handovers: u64,
    /// Answers stored in slots so far; a slot's `answered` refers to it.
    answers: u64,
}

/// A hit length from an answer: the stored tokens of a hit, 0 for anything else.
fn hit_length(answer: Option<Answer>) -> u32 {
    match answer {
        Some(Answer::Hit { hit_tokens }) => hit_tokens,
        _ => 0,
    }
}

/// The `(kind, hit_tokens, reason)` triple Python's `answer_of` wraps.
fn answer_tuple(answer: Answer) -> (&'static str, u32, Option<&'static str>) {
    match answer {
        Answer::Hit { hit_tokens } => ("hit", hit_tokens, None),
        Answer::Miss => ("miss", 0, None),
        Answer::NotNeeded => ("not_needed", 0, None),
        Answer::Unavailable(why) => ("unavailable", 0, Some(reason(why))),
    }
}

fn reason(why: Unavailable) -> &'static str {
    match why {
        Unavailable::TimedOut => "timed_out",
        Unavailable::Transport => "transport",
        Unavailable::NotSent => "not_sent",
        Unavailable::Malformed => "malformed",
        Unavailable::Store => "store",
        Unavailable::Retrying => "retrying",
        Unavailable::Closed => "closed",
        _ => "other",
    }
}

/// `f` of a caller id given as any object: a `str` is read in place (vLLM's ids,
/// no copy, no Python call); anything else as its `str()`, as the Python wrapper
/// methods did before the native methods were bound in their place.
fn with_id<R>(req_id: &Bound<'_, PyAny>, f: impl FnOnce(&str) -> R) -> PyResult<R> {
    if let Ok(s) = req_id.cast::<PyString>() {
        return Ok(f(s.to_str()?));
    }
    let s = req_id.str()?;
    Ok(f(s.to_str()?))
}

impl NativeClient {
    /// A new request of `req_id` from `num_tokens` and `block_hashes` (a sequence of
    /// `bytes`, read once here, into a slice of the client's `HashArena`: polls of a
    /// held request never read it again).
    fn new_request(
        &mut self,
        req_id: &str,
        num_tokens: u32,
        block_hashes: &Bound<'_, PyAny>,
    ) -> PyResult<Request> {
        let (hash_len, data) = self.hashes.read(req_id, block_hashes)?;
        self.request_of(req_id, num_tokens, hash_len, data)
    }

    /// A new request of `req_id` from `num_tokens` and its hashes, `hash_len` bytes
    /// each, already copied into `data`.
    fn request_of(
        &mut self,
        req_id: &str,
        num_tokens: u32,
        hash_len: u16,
        data: Bytes,
    ) -> PyResult<Request> {
        let block_hashes = BlockHashes::new(hash_len, data)
            .map_err(|e| PyValueError::new_err(format!("request {req_id}: {e}")))?;
        self.next_id += 1;
        Ok(Request {
            request_id: RequestId(self.next_id),
            num_tokens,
            block_hashes,
            skip_reading_external_kv: false,
        })
    }

    /// Holds `request` as `req_id`'s lookup (its slot's last answer stays until read
    /// over by the new one's).
    fn hold(&mut self, req_id: &str, request: Request) {
        match self.slots.get_mut(req_id.as_bytes()) {
            Some(slot) => {
                slot.request = Some(request);
                slot.polled_in = 0;
            }
            None => {
                self.slots.insert(
                    CallerId::from(req_id),
                    Slot {
                        request: Some(request),
                        answer: None,
                        polled_in: 0,
                        answered: 0,
                    },
                );
            }
        }
        self.held += 1;
    }

    /// Past [`ANSWERS_KEPT`] slots without a held lookup, drops those whose answer is
    /// not among the newest half (a held lookup is never dropped). One pass over the
    /// table per `ANSWERS_KEPT / 2` answers.
    fn bound_answers(&mut self) {
        if self.slots.len() - self.held <= ANSWERS_KEPT {
            return;
        }
        let oldest_kept = self.answers.saturating_sub(ANSWERS_KEPT as u64 / 2);
        self.slots
            .retain(|_, slot| slot.request.is_some() || slot.answered >= oldest_kept);
    }

    /// True while `req_id` has a lookup held.
    fn is_held(&self, req_id: &str) -> bool {
        self.slots
            .get(req_id.as_bytes())
            .is_some_and(|s| s.request.is_some())
    }

    /// Drops `req_id`'s held lookup, if any, and returns it; `forget` drops its last
    /// answer too (and the slot).
    fn release(&mut self, req_id: &str, forget: bool) -> Option<Request> {
        let slot = self.slots.get_mut(req_id.as_bytes())?;
        let request = slot.request.take();
        if request.is_some() {
            self.held -= 1;
        }
        if forget || slot.answer.is_none() {
            self.slots.remove(req_id.as_bytes());
        }
        request
    }

    /// Applies the arrivals deferred by `prefetch` (`arrivals`), in arrival order,
    /// each request taking its hashes' slice. An arrival whose block hashes could not
    /// be read is not prefetched: its `lookup` reads them again and raises there
    /// (vLLM's client reads them only in `lookup` too).
    fn apply_arrivals(&mut self) {
        if self.arrivals.is_empty() {
            return;
        }
        let mut arrivals = std::mem::take(&mut self.arrivals);
        arrivals.drain(|req_id, num_tokens, hashes| {
            let Some((hash_len, data)) = hashes else {
                return;
            };
            if self.is_held(req_id) {
                // Held already (a second arrival): its hashes are not read again.
                return;
            }
            // Hashes of a length BlockHashes refuses: not prefetched, as above.
            if let Ok(request) = self.request_of(req_id, num_tokens, hash_len, data) {
                self.start(req_id, request);
            }
        });
        // Kept (its vector) for the next step's arrivals.
        self.arrivals = arrivals;
    }

    /// [`prefetch`](Self::prefetch) of a `str` id: a held request is left as it is
    /// (its hashes are not read again).
    fn prefetch_str(
        &mut self,
        req_id: &str,
        num_tokens: u32,
        block_hashes: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        if self.is_held(req_id) {
            return Ok(());
        }
        let request = self.new_request(req_id, num_tokens, block_hashes)?;
        self.start(req_id, request);
        Ok(())
    }

    /// Announces `request` as `req_id`'s prefetch and holds it. Handed to the I/O
    /// task at the next call (a probe of the step, or `flush`): a step's arrivals wake
    /// it once, not once each.
    fn start(&mut self, req_id: &str, request: Request) {
        self.client.on_new_request_deferred(&request, req_id);
        self.hold(req_id, request);
    }

    /// Ends `req_id`'s held lookup, if any (its last answer dropped too when
    /// `forget`): the client hears `how` it ended, then that it finished. The common
    /// body of `discard`, `on_allocated` and `on_preempted`.
    fn end_held(
        &mut self,
        req_id: &Bound<'_, PyAny>,
        forget: bool,
        how: fn(&mut LookupClient, RequestId),
    ) -> PyResult<()> {
        self.apply_arrivals();
        with_id(req_id, |req_id| {
            if let Some(request) = self.release(req_id, forget) {
                how(&mut self.client, request.request_id);
                self.client.on_finished(request.request_id);
            }
        })
    }

    /// The Python result of `hit` tokens: the factory's, built once per hit length
    /// (at most 4,096 kept); the bare int without a factory.
    fn result(&mut self, py: Python<'_>, hit: u32) -> PyResult<Py<PyAny>> {
        if let Some(r) = self.results.get(&hit) {
            return Ok(r.clone_ref(py));
        }
        let Some(factory) = &self.result_factory else {
            return Ok(hit.into_pyobject(py)?.into_any().unbind());
        };
        let r = factory.call1(py, (hit,))?;
        if self.results.len() < 4096 {
            self.results.insert(hit, r.clone_ref(py));
        }
        Ok(r)
    }
}

/// One probe of `request`: never waits when `non_block` (the GIL is kept: nothing
/// sleeps); else waits for the answer with the GIL released.
fn probe_once(
    py: Python<'_>,
    client: &mut LookupClient,
    request: &Request,
    non_block: bool,
) -> PyResult<Probe> {
    if non_block {
        return Ok(client.probe(request, 0));
    }
    py.detach(|| client.probe_until_blocking(request, 0, Deadline::Answer))
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

#[pymethods]
impl NativeClient {
    #[new]
    fn new(
        transport: &str,
        target: &str,
        block_size: u32,
        extra_config_json: &str,
        model: &str,
    ) -> PyResult<Self> {
        let extra: serde_json::Value = serde_json::from_str(extra_config_json)
            .map_err(|e| PyValueError::new_err(format!("kv_connector_extra_config: {e}")))?;
        let builder = LookupClient::builder()
            .kv_connector_extra_config_lenient(&extra)
            .block_size(block_size)
            .lookup_async(true);
        let builder = match transport {
            "zmq" => builder.zmq(target),
            "direct" => builder.direct(target, KeyLayout::new(model)),
            other => {
                return Err(PyValueError::new_err(format!(
                    "transport {other:?}: expected \"zmq\" or \"direct\""
                )));
            }
        };
        let handle = runtime()?.handle().clone();
        // Connected on a thread of its own under SCHED_BATCH: libzmq starts its I/O
        // threads (which send and receive every RPC) from the thread that opens the
        // client's first socket, and they inherit its policy, as the runtime's own.
        let client = std::thread::spawn(move || {
            let _ = lookup_tokio::io_thread::set_batch_policy();
            builder.connect_lazy_with_handle(&handle)
        })
        .join()
        .map_err(|_| PyRuntimeError::new_err("the lookup client's connect panicked"))?
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Self {
            result_factory: None,
            results: HashMap::new(),
            client,
            slots: Table::default(),
            held: 0,
            next_id: 0,
            defer_sends: false,
            arrivals: Arrivals::default(),
            hashes: HashArena::default(),
            handovers: 1,
            answers: 0,
        })
    }

    /// vLLM's `lookup`: the result of the hit length in tokens (0 for a miss or an
    /// unavailable store; `answer_of` tells them apart; the `set_result_factory`
    /// object, else the int), or `None` while pending when `non_block`.
    /// The first call for `req_id` starts the lookup; the call that answers ends it.
    /// A blocking call releases the GIL and waits at most `lookup_timeout_s` plus the
    /// client's wait margin.
    #[pyo3(signature = (req_id, num_tokens, block_hashes, non_block = false))]
    fn lookup(
        &mut self,
        py: Python<'_>,
        req_id: &str,
        num_tokens: u32,
        block_hashes: &Bound<'_, PyAny>,
        non_block: bool,
    ) -> PyResult<Option<Py<PyAny>>> {
        self.apply_arrivals();
        let Self {
            slots,
            client,
            held,
            defer_sends,
            handovers,
            answers,
            ..
        } = self;
        let defer = *defer_sends;
        let epoch = *handovers;
        let (probe, answer) = match slots.get_mut(req_id.as_bytes()) {
            // Held: a poll (the hashes passed again are not read). A non-blocking one
            // probes, reads the answer and ends the request in one client call, on
            // one clock read.
            Some(slot) if slot.request.is_some() => {
                let request = slot.request.as_ref().expect("checked");
                // Deferred (`set_defer_sends`) unless polled already since the last
                // hand-over: once per scheduler step, the step's `flush` sends.
                let deferred = non_block && defer && slot.polled_in != epoch;
                slot.polled_in = epoch;
                let (probe, answer) = if deferred {
                    client.probe_and_finish_deferred(request, 0)
                } else if non_block {
                    if defer {
                        *handovers += 1;
                    }
                    client.probe_and_finish(request, 0)
                } else {
                    let probe = probe_once(py, client, request, false)?;
                    let answer = client.answer_of(request.request_id);
                    client.on_finished(request.request_id);
                    (probe, answer)
                };
                if probe != Probe::Pending {
                    // The answer is read: kept for `answer_of`; the request ended, so
                    // that a later lookup of the same id asks again (vLLM pops its
                    // future).
                    slot.request = None;
                    *held -= 1;
                    if let Some(answer) = answer {
                        slot.keep_answer(answer, answers);
                    }
                }
                (probe, answer)
            }
            _ => {
                // First sight: announced and probed (which starts the lookup) on one
                // clock read.
                let request = self.new_request(req_id, num_tokens, block_hashes)?;
                let (probe, answer) = if non_block && defer {
                    self.client.on_new_request_deferred(&request, req_id);
                    self.client.probe_and_finish_deferred(&request, 0)
                } else if non_block {
                    let mut step = self.client.step();
                    step.on_new_request_with_id(&request, req_id);
                    step.probe_and_finish(&request, 0)
                } else {
                    self.client.on_new_request_with_id(&request, req_id);
                    let probe = probe_once(py, &mut self.client, &request, false)?;
                    let answer = self.client.answer_of(request.request_id);
                    self.client.on_finished(request.request_id);
                    (probe, answer)
                };
                if probe == Probe::Pending {
                    self.hold(req_id, request);
                    if let Some(slot) = self.slots.get_mut(req_id.as_bytes()) {
                        slot.polled_in = self.handovers;
                    }
                } else if let Some(answer) = answer {
                    let slot = self.slots.entry(CallerId::from(req_id)).or_default();
                    slot.keep_answer(answer, &mut self.answers);
                }
                (probe, answer)
            }
        };
        if probe != Probe::Pending {
            self.bound_answers();
        }
        match probe {
            Probe::Pending => Ok(None),
            Probe::Ready { .. } => self.result(py, hit_length(answer)).map(Some),
        }
    }

    /// `factory(hit_length)` builds `lookup`'s results from now on (each hit length's
    /// once: results are shared by the requests with that answer, which vLLM's
    /// scheduler only reads); `None` goes back to bare ints.
    fn set_result_factory(&mut self, factory: Option<Py<PyAny>>) {
        self.result_factory = factory;
        self.results.clear();
    }

    /// Starts `req_id`'s lookup ahead of its first `lookup` (a prefetch: sent when
    /// `lookup_prefetch_limit` allows, rules 1-3), at this client's next call of any
    /// kind (`flush`). Never blocks.
    ///
    /// `req_id`: a `str` (vLLM's), else its `str()`; `num_tokens`: an int (or any
    /// object with `__index__`); `block_hashes` as `lookup`'s.
    ///
    /// With `set_defer_sends(True)` the arrival is only recorded: the id and the
    /// hashes copied (into the client's `HashArena`, now, while vLLM's freshly
    /// computed hashes are in the cache), nothing else; the next call of any other kind
    /// applies the arrivals together before its own work, so a scheduler step's
    /// arrivals cost one warm pass of the client's code at its first probe, not one
    /// cold call each inside `add_request`. Hashes that cannot be read are not
    /// prefetched; that request's `lookup` reads them again and raises.
    fn prefetch(
        &mut self,
        req_id: &Bound<'_, PyAny>,
        num_tokens: u32,
        block_hashes: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        if self.defer_sends {
            let arrival = with_id(req_id, str::to_owned)?;
            let hashes = self.hashes.read(&arrival, block_hashes).ok();
            self.arrivals.record(arrival, num_tokens, hashes);
            return Ok(());
        }
        with_id(req_id, |req_id| {
            self.prefetch_str(req_id, num_tokens, block_hashes)
        })?
    }

    /// `on`: from now on a non-blocking `lookup` leaves any new RPC (a request not
    /// prefetched, an expired answer, the step's deferred prefetches) for the next
    /// `flush` (or any call other than a non-blocking `lookup` or `prefetch`) instead
    /// of waking the I/O thread itself, so that a scheduler step, which polls each
    /// waiting request once, wakes it once, at its `flush`. A request polled a second
    /// time before the next `flush` hands over at that poll, so that a caller polling
    /// one request in a loop without `flush` is answered one poll later, not never.
    /// For a caller that calls `flush` once per step (the connector of
    /// `mooncake_lookup.vllm`, in `build_connector_meta`). Off by default.
    fn set_defer_sends(&mut self, on: bool) {
        self.defer_sends = on;
        if !on {
            self.apply_arrivals();
            self.client.drive();
        }
    }

    /// Hands every prefetch not sent yet to the I/O task (the connector calls it once
    /// per scheduler step, in `build_connector_meta`; any other call does it too).
    /// Never blocks.
    fn flush(&mut self) {
        self.apply_arrivals();
        self.handovers += 1;
        self.client.drive();
    }

    /// What `req_id`'s last answer rested on: `(kind, hit_tokens, reason)` with kind
    /// `"hit"`, `"miss"`, `"not_needed"` or `"unavailable"` (then `reason` is
    /// `"timed_out"`, `"transport"`, `"not_sent"`, `"malformed"`, `"store"` (the
    /// server's store-unavailable reply, `spec/wire.md`), `"retrying"` or `"closed"`),
    /// `None` when it has none (rule 11): never looked up, discarded, or an answer
    /// kept without a discard that went when more than [`ANSWERS_KEPT`] were kept (the
    /// older half goes then).
    /// `req_id` as `prefetch`'s.
    fn answer_of(
        &self,
        req_id: &Bound<'_, PyAny>,
    ) -> PyResult<Option<(&'static str, u32, Option<&'static str>)>> {
        with_id(req_id, |req_id| {
            self.slots
                .get(req_id.as_bytes())
                .and_then(|s| s.answer)
                .map(answer_tuple)
        })
    }

    /// vLLM's `discard`: drops `req_id`'s lookup, queued, in flight or answered, and
    /// its last answer. Never blocks. `req_id` as `prefetch`'s.
    fn discard(&mut self, req_id: &Bound<'_, PyAny>) -> PyResult<()> {
        self.end_held(req_id, true, |_, _| {})
    }

    /// The request got its blocks (vLLM's `update_state_after_alloc`, rule 8): its
    /// lookup, if any is still held (a prefetch never read), is consumed and dropped.
    /// Never blocks. `req_id` as `prefetch`'s.
    fn on_allocated(&mut self, req_id: &Bound<'_, PyAny>) -> PyResult<()> {
        self.end_held(req_id, false, LookupClient::on_allocated)
    }

    /// The request was preempted (vLLM's `preempted_req_ids`, rule 8): its lookup and
    /// last answer are dropped; it is looked up again when rescheduled. Never blocks.
    /// `req_id` as `prefetch`'s.
    fn on_preempted(&mut self, req_id: &Bound<'_, PyAny>) -> PyResult<()> {
        self.end_held(req_id, true, LookupClient::on_preempted)
    }

    /// vLLM's `reset`: drops every lookup (rule 13), asks the server to wipe the
    /// store and waits for its answer (GIL released), at most `lookup_timeout_s` plus
    /// the wait margin. True when the server acknowledged.
    fn reset(&mut self, py: Python<'_>) -> PyResult<bool> {
        self.arrivals.clear();
        self.slots.clear();
        self.held = 0;
        let client = &mut self.client;
        let rt = runtime()?;
        let outcome = py.detach(|| rt.block_on(client.reset_and_wait()));
        Ok(matches!(outcome, Ok(ResetOutcome::Ok)))
    }

    /// vLLM's `close` (rule 14): stops the I/O task; later lookups answer 0 at once.
    /// Idempotent.
    fn close(&mut self) {
        self.arrivals.clear();
        // Last answers stay readable (`answer_of`); held lookups go.
        self.slots.retain(|_, slot| {
            slot.request = None;
            slot.answer.is_some()
        });
        self.held = 0;
        self.client.close();
    }

    /// Requests tracked (announced, not yet answered or discarded).
    fn tracked_requests(&mut self) -> usize {
        self.apply_arrivals();
        self.held
    }

    /// The client's counters as a dict of ints: `rpcs_sent`, `late_replies`,
    /// `socket_reopens`, `waits_gave_up`, `slots_in_use`, `open_rpcs`.
    fn stats(&mut self) -> HashMap<&'static str, u64> {
        self.apply_arrivals();
        let s = self.client.stats();
        HashMap::from([
            ("rpcs_sent", s.rpcs_sent),
            ("late_replies", s.late_replies),
            ("socket_reopens", s.socket_reopens),
            ("waits_gave_up", s.waits_gave_up),
            ("slots_in_use", s.slots_in_use as u64),
            ("open_rpcs", s.open_rpcs as u64),
        ])
    }
}

/// The `kv_connector_extra_config` keys the Rust client reads (every setting of
/// `lookup_core::settings::SETTINGS`, then vLLM's `lookup_rpc_port`), in that order:
/// the Python package names a `lookup_*` key outside them (and its own) as unknown.
#[pyfunction]
fn extra_config_keys() -> Vec<&'static str> {
    lookup_core::settings::SETTINGS
        .iter()
        .map(|s| s.key)
        .chain(std::iter::once("lookup_rpc_port"))
        .collect()
}

/// The module `mooncake_lookup._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeClient>()?;
    m.add_function(wrap_pyfunction!(extra_config_keys, m)?)?;
    // The I/O threads' name, which a caller may look for (their policy, their CPU).
    m.add("IO_THREAD_NAME", IO_THREAD_NAME)?;
    Ok(())
}
