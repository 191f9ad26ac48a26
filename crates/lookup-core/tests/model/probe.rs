//! The reference model of the scheduler's arrival and probe inputs
//! (`spec/behaviour.md` rules 1-7 and 10-12): what `on_new_request` and `probe`
//! must do given the model's state (`reference.rs`).

use lookup_core::{Answer, OnPreemption, Probe, Unavailable};

use crate::reference::{Live, Lookup, Preemption, Record, RefState, ready};
use crate::server::Prompt;
use crate::transitions::{LocalHit, PromptChange, Slot};

impl RefState {
    /// A request not alive in `slot` arrives.
    pub(crate) fn arrive(&mut self, slot: Slot, prompt: Prompt) {
        self.requests[slot] = Some(Live {
            prompt,
            record: None,
        });
        self.on_new_request(slot);
    }

    /// `on_new_request` again for the live request in `slot`.
    pub(crate) fn rearrive(&mut self, slot: Slot, change: PromptChange) {
        let live = self.requests[slot].as_mut().expect("precondition: live");
        live.prompt = change.apply(live.prompt, self.settings.shape);
        self.on_new_request(slot);
    }

    /// Rule 2 and the configuration table. A request whose lookup is queued, in flight
    /// or done keeps it, whatever prompt it arrives with; one without (after its
    /// allocation, or refused a slot before) is prefetched as at its first arrival.
    fn on_new_request(&mut self, slot: Slot) {
        if self.closed || !self.settings.prefetch() {
            return;
        }
        self.consume_retained(slot);
        let prompt = self.requests[slot].as_ref().expect("live").prompt;
        let eligible = prompt.eligible(self.settings.shape);
        let live = self.requests[slot].as_mut().expect("live");
        let record = live.record.get_or_insert(Record {
            eligible,
            first_probe: None,
            last_answer: None,
            lookup: None,
            failed: false,
            preemption: Preemption::No,
        });
        // Rule 11: a failed request is looked up again by a probe, under the backoff.
        if record.lookup.is_some() || record.failed {
            return;
        }
        if !eligible {
            self.counters.prefetch_ineligible += 1;
            return;
        }
        if self.slots_in_use() >= self.settings.prefetch_limit {
            self.counters.prefetch_cap_full += 1;
            return;
        }
        // Ours (`Config::max_queued`): a prefetch is not queued behind a full backlog.
        let queued = self.rpcs.values().filter(|r| r.sent.is_none()).count();
        if queued >= self.settings.max_queued as usize {
            self.counters.prefetch_backlog_full += 1;
            return;
        }
        self.submit(slot, prompt.question(self.settings.shape), true);
    }

    /// A probe of the request in `slot` (live: the scheduler has it, whether or not it
    /// arrived) with `prompt` and a local hit of `local`.
    pub(crate) fn probe(&mut self, slot: Slot, prompt: Prompt, local: LocalHit) {
        let shape = self.settings.shape;
        self.consume_retained(slot);
        self.requests[slot].as_mut().expect("live").prompt = prompt;
        let cap = shape.hit_cap(prompt.num_tokens);
        let num_computed_tokens = local.tokens(shape, prompt.num_tokens);
        let open = !self.closed && self.settings.enable_lookup;
        if open {
            let live = self.requests[slot].as_mut().expect("live");
            live.record.get_or_insert(Record {
                eligible: prompt.eligible(shape),
                first_probe: None,
                last_answer: None,
                lookup: None,
                failed: false,
                preemption: Preemption::No,
            });
        }
        let (answer, basis) = self.probe_answer(slot, prompt, num_computed_tokens, cap);
        let is_ready = matches!(answer, Probe::Ready { .. });
        if is_ready {
            self.counters.probes_ready += 1;
            let c = &mut self.counters;
            match basis {
                Answer::Hit { .. } => c.answers_hit += 1,
                Answer::Miss => c.answers_miss += 1,
                Answer::NotNeeded => c.answers_not_needed += 1,
                Answer::Unavailable(_) => c.answers_unavailable += 1,
            }
        } else {
            self.counters.probes_pending += 1;
        }
        if let Some(record) = self.record_mut(slot) {
            if is_ready {
                record.last_answer = Some(basis);
            }
            if record.first_probe.is_none() {
                record.first_probe = Some(is_ready);
                let eligible = record.eligible;
                if eligible && is_ready {
                    self.counters.first_probes_ready += 1;
                } else if eligible {
                    self.counters.first_probes_pending += 1;
                }
            }
        }
        self.expected.probe = Some(answer);
    }

    /// The probe's answer and, for `Ready`, what it rests on.
    fn probe_answer(
        &mut self,
        slot: Slot,
        prompt: Prompt,
        num_computed_tokens: u32,
        cap: u32,
    ) -> (Probe, Answer) {
        let load_async = self.settings.load_async;
        let pending = (Probe::Pending, Answer::NotNeeded);
        // Rule 14 and `enable_lookup = false`.
        if self.closed {
            return (ready(0, false), Answer::Unavailable(Unavailable::Closed));
        }
        if !self.settings.enable_lookup {
            return (ready(0, false), Answer::Unavailable(Unavailable::Disabled));
        }
        let question = prompt.question(self.settings.shape);
        let lookup = self.record(slot).and_then(|r| r.lookup.clone());
        let failed = self.record(slot).is_some_and(|r| r.failed);
        // Rule 8, `keep`: a preempted request's kept lookup answers a prompt that
        // extends the one looked up (same chain, no fewer tokens or hashes).
        let keeps = matches!(
            self.settings.on_preemption,
            OnPreemption::Keep | OnPreemption::KeepWait
        );
        let kept = keeps
            && self
                .record(slot)
                .is_some_and(|r| r.preemption == Preemption::Preempted);
        let answers = |l: &Lookup| {
            let old = l.question();
            old == question
                || (kept
                    && old.chain == question.chain
                    && old.num_hashes >= 1
                    && question.num_hashes >= old.num_hashes
                    && question.num_tokens >= old.num_tokens)
        };
        if prompt.skip || question.num_hashes == 0 || cap <= num_computed_tokens {
            // Nothing to load whatever the store holds: no RPC. Rule 7 still drops a
            // lookup of another question: its answer can never be used.
            if lookup.is_some_and(|l| !answers(&l)) {
                self.counters.chain_refreshes += 1;
                self.discard(slot);
            }
            return (ready(0, false), Answer::NotNeeded);
        }
        match lookup {
            Some(l) if !answers(&l) => {
                // Rule 7.
                self.counters.chain_refreshes += 1;
                self.discard(slot);
            }
            Some(Lookup::Done {
                answer: answer @ Answer::Unavailable(_),
                owed,
                ..
            }) => {
                // Rule 11: the probe that waited reads the failure once; then the
                // request is looked up again, one failed request at a time, once the
                // failure backoff has passed.
                if owed {
                    self.set_owed(slot, false);
                    return (ready(0, false), answer);
                }
                if self.retrying.is_some() || self.retry_at_ns.is_some_and(|t| self.now_ns < t) {
                    return (ready(0, false), Answer::Unavailable(Unavailable::Retrying));
                }
                self.counters.retries_after_failure += 1;
                self.discard(slot);
                let rpc = self.submit(slot, question, false);
                self.retrying = Some(rpc);
                return pending;
            }
            Some(Lookup::Done {
                answer,
                replied_at,
                owed,
                ..
            }) => {
                // Rules 5-6: a result is good until `ttl` after its reply, except that
                // the probe that waited for it reads it whatever its age.
                if !owed && self.now_ns - replied_at > self.ttl_ns {
                    self.counters.ttl_refreshes += 1;
                    self.discard(slot);
                } else {
                    self.set_owed(slot, false);
                    // Rule 12.
                    let external = answer
                        .hit_tokens()
                        .min(cap)
                        .saturating_sub(num_computed_tokens);
                    return (ready(external, load_async), answer);
                }
            }
            Some(Lookup::Waiting { rpc, .. }) => {
                // Rules 4 and 15.
                self.promote(rpc, slot);
                return pending;
            }
            None => {}
        }
        if failed {
            // Rule 11 whatever the prompt is now (it changed, or a probe that needed
            // nothing dropped the failed lookup): the next lookup is a retry.
            if self.retrying.is_some() || self.retry_at_ns.is_some_and(|t| self.now_ns < t) {
                return (ready(0, false), Answer::Unavailable(Unavailable::Retrying));
            }
            self.counters.retries_after_failure += 1;
            let rpc = self.submit(slot, question, false);
            self.retrying = Some(rpc);
            return pending;
        }
        self.submit(slot, question, false);
        pending
    }

    fn set_owed(&mut self, slot: Slot, to: bool) {
        if let Some(Lookup::Done { owed, .. }) =
            self.record_mut(slot).and_then(|r| r.lookup.as_mut())
        {
            *owed = to;
        }
    }
}
