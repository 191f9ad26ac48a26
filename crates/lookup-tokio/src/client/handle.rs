//! [`LookupHandle`]: a cloneable sender that other tasks use to announce arrivals and
//! finishes into the client's thread (a front end that sees a request before the hop
//! to the scheduler). The client applies announcements at the start of its next call,
//! in the order they were sent; they never cross the client's state directly.

use lookup_core::{Request, RequestId};
use tokio::sync::mpsc::UnboundedSender;

use crate::Error;

/// What a handle announces.
#[derive(Debug)]
pub(crate) enum Announce {
    Arrival(Request),
    Finished(RequestId),
}

/// A cloneable, `Send` handle on a [`LookupClient`](crate::LookupClient) for other
/// tasks and threads: [`on_new_request`](Self::on_new_request) and
/// [`on_finished`](Self::on_finished) are queued (unbounded, never blocking) and
/// applied by the client at the start of its next call, before that call's own input.
#[derive(Clone, Debug)]
pub struct LookupHandle {
    pub(crate) tx: UnboundedSender<Announce>,
}

impl LookupHandle {
    /// Announces an arrival (vLLM's `on_new_request`; rules 1-3), applied at the
    /// client's next call.
    ///
    /// # Errors
    /// [`Error::Closed`] once the client is gone (dropped); nothing is queued then.
    pub fn on_new_request(&self, req: Request) -> Result<(), Error> {
        self.tx
            .send(Announce::Arrival(req))
            .map_err(|_| Error::Closed)
    }

    /// Announces that a request finished or was aborted (rule 8), applied at the
    /// client's next call.
    ///
    /// # Errors
    /// [`Error::Closed`] once the client is gone (dropped).
    pub fn on_finished(&self, request_id: RequestId) -> Result<(), Error> {
        self.tx
            .send(Announce::Finished(request_id))
            .map_err(|_| Error::Closed)
    }
}
