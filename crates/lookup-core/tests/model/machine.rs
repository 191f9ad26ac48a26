//! The reference model as a [`ReferenceStateMachine`]: each transition applied to
//! the lifecycle half (`reference.rs`) or the wire half (`dispatcher.rs`), then the
//! driver's loop settles the wire.

use lookup_core::RpcFailure;
use proptest::prelude::*;
use proptest_state_machine::ReferenceStateMachine;

use crate::reference::{Expected, NEVER_ID, RefState};
use crate::strategies;
use crate::transitions::{DeadTarget, Transition};

impl RefState {
    fn dead_id(&self, target: DeadTarget) -> u64 {
        match target {
            DeadTarget::Ended(i) => self.ended[i],
            DeadTarget::Never => NEVER_ID,
        }
    }

    pub(crate) fn step(&mut self, transition: &Transition) {
        self.expected = Expected::default();
        let shape = self.settings.shape;
        match *transition {
            Transition::Arrive { slot, prompt } => self.arrive(slot, prompt),
            Transition::Rearrive { slot, change } => self.rearrive(slot, change),
            Transition::Probe {
                slot,
                change,
                local,
            } => {
                let prompt = self.requests[slot].as_ref().expect("live").prompt;
                self.probe(slot, change.apply(prompt, shape), local);
            }
            Transition::ProbeUnarrived {
                slot,
                prompt,
                local,
            } => {
                self.requests[slot] = Some(crate::reference::Live {
                    prompt,
                    record: None,
                });
                self.probe(slot, prompt, local);
            }
            Transition::Allocated { slot } => self.allocated(slot),
            Transition::Preempted { slot } => self.preempted(slot),
            Transition::Finished { slot } => self.finish(slot),
            Transition::Reset => self.reset(),
            Transition::Close => self.close(),
            Transition::Advance { ms } => self.now_ns += u128::from(ms) * 1_000_000,
            Transition::FireTimeout => {
                if let Some(deadline) = self.next_deadline() {
                    self.now_ns = self.now_ns.max(deadline);
                }
            }
            Transition::Write { index } => self.write(index),
            Transition::WriteFailed { index, failure } => self.write_failed(index, failure),
            Transition::EarlyReply { index, value } => self.early_reply(index, value),
            Transition::Answer {
                wire_index,
                value,
                duplicate,
            } => {
                let entry = if duplicate {
                    self.wire[wire_index].clone()
                } else {
                    self.wire.remove(wire_index)
                };
                self.deliver(entry.rpc_id.0, value, Some(&entry.body));
            }
            Transition::TransportError { wire_index } => {
                let entry = self.wire.remove(wire_index);
                self.send_failed(entry.rpc_id.0, RpcFailure::Transport);
            }
            Transition::Lose { wire_index } => {
                self.wire.remove(wire_index);
            }
            Transition::DeadReply { target, value } => {
                let id = self.dead_id(target);
                match value {
                    Some(v) => self.deliver(id, v, None),
                    None => self.send_failed(id, RpcFailure::Transport),
                }
            }
            Transition::Reopen => self.reopen(None),
            Transition::DropConnection => self.wire.clear(),
            Transition::ReplaceConnection { keep_reset } => {
                let keep = keep_reset.then(|| self.oldest_reset_released()).flatten();
                self.reopen(keep);
            }
        }
        self.settle();
    }
}

/// The [`ReferenceStateMachine`] over [`RefState`].
pub(crate) struct Model;

impl ReferenceStateMachine for Model {
    type State = RefState;
    type Transition = Transition;

    fn init_state() -> BoxedStrategy<RefState> {
        strategies::settings().prop_map(RefState::new).boxed()
    }

    fn transitions(state: &RefState) -> BoxedStrategy<Transition> {
        strategies::transition(state)
    }

    fn apply(mut state: RefState, transition: &Transition) -> RefState {
        state.step(transition);
        state
    }

    fn preconditions(state: &RefState, transition: &Transition) -> bool {
        let pool = state.settings.pool;
        let live = |slot: usize| slot < pool && state.requests[slot].is_some();
        match *transition {
            Transition::Arrive { slot, .. } | Transition::ProbeUnarrived { slot, .. } => {
                slot < pool && !live(slot)
            }
            Transition::Rearrive { slot, .. } | Transition::Probe { slot, .. } => live(slot),
            Transition::Allocated { slot }
            | Transition::Preempted { slot }
            | Transition::Finished { slot } => slot < pool,
            Transition::Answer { wire_index, .. }
            | Transition::TransportError { wire_index }
            | Transition::Lose { wire_index } => wire_index < state.wire.len(),
            Transition::Write { index }
            | Transition::WriteFailed { index, .. }
            | Transition::EarlyReply { index, .. } => index < state.unwritten.len(),
            Transition::DeadReply {
                target: DeadTarget::Ended(i),
                ..
            } => i < state.ended.len(),
            _ => true,
        }
    }
}
