//! Driving the core by hand: the state machine and the dispatcher, with a fake server
//! that answers at once (what `lookup-tokio`'s `LookupClient` does for you; the
//! driving loop is in `lookup_core`'s crate docs). `docs/scheduler.md`'s "Embedding the core"
//! shows the part between the markers verbatim (a test below checks it).
//! Run: `cargo run -p lookup-core --example embed_core`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // embed: begin
    use lookup_core::{BlockHashes, Config, Dispatcher, Lookups, Probe, Reply, Request, RequestId};
    use std::time::{Duration, Instant};

    let mut config = Config::new(16); // block size: 16 tokens
    config.lookup_async = true;
    config.lookup_prefetch_limit = 8; // look up at arrival, 8 at most in flight
    let mut lookups = Lookups::new(config.clone())?;
    let mut dispatcher: Dispatcher = Dispatcher::new(&config); // priority, max_in_flight
    let req = Request {
        request_id: RequestId(1),
        num_tokens: 48,
        block_hashes: BlockHashes::from_u64s(&[11, 12, 13]),
        skip_reading_external_kv: false,
    };
    let now = Instant::now();

    lookups.on_new_request(&req, now); // the request arrives: its lookup starts
    while let Some(cmd) = lookups.poll_transmit() {
        dispatcher.push(cmd, (), now);
    }
    while let Some(rpc) = dispatcher.poll_transmit(now) {
        // write rpc.body to the socket
        let replied = now + Duration::from_millis(1); // ... when its reply arrives:
        dispatcher.handle_reply(rpc.rpc_id, Reply::Lookup { hit_tokens: 32 }, replied);
    }
    while let Some((event, ())) = dispatcher.poll_event() {
        lookups.handle_wire_event(event);
    }
    let probe = lookups.probe(&req, 0, now + Duration::from_millis(2)); // the scheduler
    assert_eq!(
        probe,
        Probe::Ready {
            external_tokens: 32,
            load_async: true
        }
    );
    lookups.on_allocated(req.request_id); // consumed
    // embed: end
    println!("{probe:?}");
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn it_runs() {
        super::main().expect("the example runs");
    }

    /// `docs/scheduler.md`'s "Embedding the core" is this file's, verbatim (indentation aside).
    #[test]
    fn the_docs_show_this_example() {
        let example = include_str!("embed_core.rs");
        let begin = example.find("    // embed: begin\n").unwrap() + 20;
        let end = example.find("    // embed: end").unwrap();
        let snippet: String = example[begin..end]
            .lines()
            .map(|line| format!("{}\n", line.strip_prefix("    ").unwrap_or(line)))
            .collect();
        let docs = include_str!("../../../docs/scheduler.md");
        assert!(
            docs.contains(&format!("```rust\n{snippet}```")),
            "docs/scheduler.md does not show examples/embed_core.rs verbatim"
        );
    }
}
