//! [`Step`]: one scheduler step's calls on one clock read, one pass over the I/O
//! task's reports and one hand-over of new RPCs, instead of one of each per call.
//!
//! A step of vLLM's scheduler makes one probe per waiting request it reaches
//! (`get_num_new_matched_tokens`), plus the step's arrivals, allocations and
//! finishes. Through [`LookupClient`]'s own methods each of those calls reads the
//! clock, reads both report channels and syncs the metrics; through a [`Step`] they
//! cost the core's work alone, so a step's lookup time is the core's hash-map reads
//! and little else, whatever the queue length.

use std::sync::Arc;
use std::time::Instant;

use lookup_core::{Answer, Probe, Request, RequestId};

use super::LookupClient;

/// One scheduler step's lookup calls ([`LookupClient::step`]).
///
/// Made by [`LookupClient::step`], which reads the clock once and applies what the
/// I/O task reported; every call through it uses that instant and that state; its
/// drop hands the step's new RPCs to the I/O task together and publishes the
/// metrics once. So, against the client's own methods:
///
/// - answers that arrive during the step are seen at the next step (a probe reads
///   the state as of the step's start, as vLLM's `future.done()` would at that
///   instant);
/// - lookups started in the step (arrivals that prefetch, first probes) go out when
///   the step ends, a scheduling pass later: microseconds, against the store's
///   round trip of 0.1-2 ms.
///
/// The rules are the client's (`spec/behaviour.md` rules 1-12): each method is the
/// [`LookupClient`] method of the same name.
#[derive(Debug)]
#[must_use = "a step's calls go out when it is dropped"]
pub struct Step<'a> {
    client: &'a mut LookupClient,
    now: Instant,
}

impl LookupClient {
    /// Starts a scheduler step: one clock read and one pass over the I/O task's
    /// reports for every call made through the returned [`Step`] until it drops.
    /// Never blocks.
    pub fn step(&mut self) -> Step<'_> {
        let now = self.begin();
        Step { client: self, now }
    }
}

impl Step<'_> {
    /// The step's instant: the one clock read every call of the step uses.
    #[must_use]
    pub const fn now(&self) -> Instant {
        self.now
    }

    /// [`LookupClient::on_new_request`] at the step's instant.
    pub fn on_new_request(&mut self, req: &Request) {
        self.client.arrive_at(req, None, self.now);
    }

    /// [`LookupClient::on_new_request_with_id`] at the step's instant.
    pub fn on_new_request_with_id(&mut self, req: &Request, caller_id: &str) {
        self.client.arrive_at(req, Some(caller_id), self.now);
    }

    /// [`LookupClient::probe`] at the step's instant, with the state as of the
    /// step's start.
    pub fn probe(&mut self, req: &Request, num_computed_tokens: u32) -> Probe {
        self.client.probe_core(req, num_computed_tokens, self.now)
    }

    /// A probe that, when it answers `Ready`, also reads what the answer rested on
    /// ([`LookupClient::answer_of`]) and ends the request
    /// ([`LookupClient::on_finished`]): vLLM's `lookup(..., non_block=True)`, whose
    /// answering call pops the request's lookup, in one call. `None` with `Pending`.
    pub fn probe_and_finish(
        &mut self,
        req: &Request,
        num_computed_tokens: u32,
    ) -> (Probe, Option<Answer>) {
        self.client
            .probe_and_finish_at(req, num_computed_tokens, self.now)
    }

    /// [`LookupClient::answer_of`], as of the step's start and its calls so far.
    #[must_use]
    pub fn answer_of(&self, request_id: RequestId) -> Option<Answer> {
        self.client.core.answer_of(request_id)
    }

    /// [`LookupClient::on_allocated`] (rule 8).
    pub fn on_allocated(&mut self, request_id: RequestId) {
        self.client.core.on_allocated(request_id);
    }

    /// [`LookupClient::on_finished`] (rules 8-9).
    pub fn on_finished(&mut self, request_id: RequestId) {
        let c = &mut *self.client;
        c.core.observer_mut().finished(request_id);
        c.core.on_finished(request_id);
    }

    /// [`LookupClient::on_preempted`] (rule 8).
    pub fn on_preempted(&mut self, request_id: RequestId) {
        self.client.core.on_preempted(request_id);
    }
}

impl Drop for Step<'_> {
    fn drop(&mut self) {
        self.client.end();
    }
}

impl LookupClient {
    /// An arrival whose prefetch RPC (if any, rules 1-3) is handed to the I/O task at
    /// the client's next call of any kind ([`drive`](Self::drive) to send it now),
    /// not at once: the arrivals before a scheduler step then wake the I/O task once,
    /// at the step's first probe, instead of once each. Reads the clock; applies
    /// nothing the I/O task reported. Never blocks.
    pub fn on_new_request_deferred(&mut self, req: &Request, caller_id: &str) {
        self.arrive_at(req, Some(caller_id), crate::clock::now());
    }

    /// [`probe_and_finish`](Self::probe_and_finish) whose new RPC (a first probe's
    /// lookup) is handed to the I/O task at the next call that hands over
    /// ([`drive`](Self::drive), or any call but this one and
    /// [`on_new_request_deferred`](Self::on_new_request_deferred)), not at once: a
    /// caller that drives once per scheduler step wakes the I/O task once per step,
    /// not once per submit. Reads the clock and applies the I/O task's reports as
    /// every call does; publishes no metrics (the next handing-over call does).
    /// Never blocks.
    pub fn probe_and_finish_deferred(
        &mut self,
        req: &Request,
        num_computed_tokens: u32,
    ) -> (Probe, Option<Answer>) {
        let now = self.begin();
        self.probe_and_finish_at(req, num_computed_tokens, now)
    }

    /// An arrival at `now`, named `caller_id` when given; hands nothing over.
    pub(super) fn arrive_at(&mut self, req: &Request, caller_id: Option<&str>, now: Instant) {
        // The id is copied only when a span will record it.
        let caller_id = caller_id
            .filter(|_| super::observer::caller_ids_wanted())
            .map(Arc::from);
        self.core.observer_mut().arrived(req.request_id, caller_id);
        self.core.on_new_request(req, now);
    }

    /// A probe at `now` that, when it answers `Ready`, reads the answer's basis and
    /// ends the request; hands nothing over.
    fn probe_and_finish_at(
        &mut self,
        req: &Request,
        num_computed_tokens: u32,
        now: Instant,
    ) -> (Probe, Option<Answer>) {
        let probe = self.probe_core(req, num_computed_tokens, now);
        if matches!(probe, Probe::Pending) {
            return (probe, None);
        }
        let answer = self.core.answer_of(req.request_id);
        self.core.observer_mut().finished(req.request_id);
        self.core.on_finished(req.request_id);
        (probe, answer)
    }

    /// [`Step::probe_and_finish`] as a call of its own: one clock read and one pass
    /// over the reports for the probe, the answer's basis and the request's end
    /// (the Python drop-in's `lookup`). Never blocks.
    pub fn probe_and_finish(
        &mut self,
        req: &Request,
        num_computed_tokens: u32,
    ) -> (Probe, Option<Answer>) {
        self.step().probe_and_finish(req, num_computed_tokens)
    }
}

#[cfg(test)]
mod tests {
    //! A step's calls on virtual time against the seeded fake wire (5 ms per RPC).

    use std::time::Duration;

    use lookup_core::{Answer, BlockHashes, Probe, Request, RequestId};
    use tokio::runtime::Handle;

    use crate::io::fake::{FakeWire, Knobs};
    use crate::{ClientConfig, Endpoint, LookupClient};

    const MS: Duration = Duration::from_millis(1);
    const READY: Probe = Probe::Ready {
        external_tokens: 64,
        load_async: true,
    };

    fn req(id: u64) -> Request {
        let hashes: Vec<u64> = (0..4).map(|b| id * 1000 + b).collect();
        Request {
            request_id: RequestId(id),
            num_tokens: 65,
            block_hashes: BlockHashes::from_u64s(&hashes),
            skip_reading_external_kv: false,
        }
    }

    /// A prefetching client over the fake wire: every lookup answers after 5 ms with
    /// its whole blocks stored.
    fn client() -> LookupClient {
        let knobs = Knobs {
            latency: (5 * MS, 5 * MS),
            hit: |n| n / 16 * 16,
            ..Knobs::default()
        };
        let (wire, _, _) = FakeWire::new(11, knobs);
        let endpoint: Endpoint = "ipc:///tmp/unused-fake-wire".parse().expect("endpoint");
        let mut config = ClientConfig::zmq(endpoint, 16);
        config.core.lookup_async = true;
        config.core.lookup_prefetch_limit = 8;
        config.core.max_in_flight = 8;
        LookupClient::with_wire(config, wire, &Handle::current()).expect("client")
    }

    #[tokio::test(start_paused = true)]
    async fn a_steps_lookups_go_out_when_it_ends() {
        let mut client = client();
        let (a, b) = (req(1), req(2));
        let mut step = client.step();
        step.on_new_request(&a);
        step.on_new_request(&b);
        // Held by the step: 7 ms later nothing went out, so nothing came back.
        tokio::time::sleep(7 * MS).await;
        drop(step);
        assert_eq!(
            client.probe(&a, 0),
            Probe::Pending,
            "sent at the step's end"
        );
        tokio::time::sleep(6 * MS).await;
        let mut step = client.step();
        assert_eq!(step.probe(&a, 0), READY);
        assert_eq!(step.probe(&b, 0), READY);
        drop(step);
        assert_eq!(client.stats().rpcs_sent, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_step_reads_the_answers_as_of_its_start() {
        let mut client = client();
        let a = req(1);
        client.on_new_request(&a);
        let mut step = client.step();
        assert_eq!(step.probe(&a, 0), Probe::Pending);
        tokio::time::sleep(7 * MS).await;
        // Answered on the wire meanwhile, read at the next step.
        assert_eq!(step.probe(&a, 0), Probe::Pending);
        drop(step);
        let mut step = client.step();
        assert_eq!(
            step.probe(&a, 16),
            Probe::Ready {
                external_tokens: 48,
                load_async: true
            }
        );
        step.on_allocated(a.request_id);
        step.on_finished(a.request_id);
        drop(step);
        assert_eq!(client.core().tracked_requests(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_deferred_arrival_goes_out_at_the_next_call() {
        let mut client = client();
        let (a, b) = (req(1), req(2));
        client.on_new_request_deferred(&a, "a");
        client.on_new_request_deferred(&b, "b");
        tokio::time::sleep(7 * MS).await;
        // Nothing went out yet; the probe hands both RPCs over.
        assert_eq!(client.probe(&a, 0), Probe::Pending);
        tokio::time::sleep(6 * MS).await;
        assert_eq!(client.probe(&a, 0), READY);
        assert_eq!(client.probe(&b, 0), READY);
        assert_eq!(client.stats().rpcs_sent, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_deferred_probe_goes_out_at_the_next_drive() {
        let mut client = client();
        let (a, b) = (req(1), req(2));
        client.on_new_request_deferred(&a, "a");
        assert_eq!(
            client.probe_and_finish_deferred(&a, 0),
            (Probe::Pending, None)
        );
        // A first probe's lookup (b is not announced): deferred as well.
        assert_eq!(
            client.probe_and_finish_deferred(&b, 0),
            (Probe::Pending, None)
        );
        tokio::time::sleep(7 * MS).await;
        // Nothing went out, so nothing came back.
        assert_eq!(
            client.probe_and_finish_deferred(&a, 0),
            (Probe::Pending, None)
        );
        client.drive();
        tokio::time::sleep(6 * MS).await;
        assert_eq!(
            client.probe_and_finish_deferred(&a, 0),
            (READY, Some(Answer::Hit { hit_tokens: 64 }))
        );
        assert_eq!(
            client.probe_and_finish_deferred(&b, 0),
            (READY, Some(Answer::Hit { hit_tokens: 64 }))
        );
        assert_eq!(
            client.core().tracked_requests(),
            0,
            "ended by the answering calls"
        );
        assert_eq!(client.stats().rpcs_sent, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn probe_and_finish_reads_the_answer_and_ends_the_request() {
        let mut client = client();
        let a = req(1);
        client.on_new_request(&a);
        assert_eq!(client.probe_and_finish(&a, 0), (Probe::Pending, None));
        assert_eq!(client.core().tracked_requests(), 1);
        tokio::time::sleep(7 * MS).await;
        assert_eq!(
            client.probe_and_finish(&a, 0),
            (READY, Some(Answer::Hit { hit_tokens: 64 }))
        );
        assert_eq!(
            client.core().tracked_requests(),
            0,
            "ended by the answering call"
        );
        assert_eq!(client.core.observer().tracked(), 0);
        assert_eq!(client.answer_of(a.request_id), None);
    }
}
