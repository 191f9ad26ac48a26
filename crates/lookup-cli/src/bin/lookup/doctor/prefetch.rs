//! The `prefetch` check: do the settings start lookups when a request arrives, and
//! does one that started answer before the first probe? The settings are read as the
//! client reads them (`ClientStats::prefetch_inactive`: `lookup_prefetch_limit > 0`
//! with `lookup_async` or `enable_lookup` false); an active prefetch is then run once
//! with a real [`LookupClient`] on the same transport.

use std::time::{Duration, Instant};

use lookup_core::answer::blocks_to_check;
use lookup_core::{BlockHashes, Event, Probe, Request, RequestId};
use lookup_tokio::{ClientConfig, DirectConfig, LookupClient, MasterAddr, ZmqConfig};

use super::{DoctorArgs, Report, ms};

/// Prints the `prefetch` line.
pub(crate) async fn check(
    report: &mut Report,
    args: &DoctorArgs,
    block_hashes: &BlockHashes,
    reachable: bool,
    timeout: Duration,
) {
    let limit = args.settings.core.lookup_prefetch_limit;
    if !args.settings.core.enable_lookup {
        report.fail(
            "prefetch",
            "lookup is disabled (enable_lookup false): every probe answers 0 external tokens",
            "--enable-lookup true (vLLM: enable_lookup in kv_connector_extra_config)",
        );
        return;
    }
    match (args.settings.core.lookup_async, limit) {
        (false, 0) if !reachable => {
            report.not_checked(
                "prefetch",
                "off by the settings (sync lookups, lookup_async false); no lookup was tried: \
                 the store is unreachable",
            );
            return;
        }
        (false, 0) => {
            report.ok(
                "prefetch",
                "off: sync lookups (lookup_async false), each probe waits for its lookup",
            );
            return;
        }
        (false, _) => {
            report.warn(
                "prefetch",
                &format!(
                    "configured but inactive: lookup_prefetch_limit {limit} with lookup_async \
                     false starts no lookup at arrival"
                ),
                "--lookup-async true, or --lookup-prefetch-limit 0",
            );
            return;
        }
        (true, 0) => {
            report.warn(
                "prefetch",
                "off: lookup_prefetch_limit 0, so each lookup starts at the first probe, \
                 which answers Pending",
                "--lookup-prefetch-limit 32 starts lookups when requests arrive",
            );
            return;
        }
        (true, _) => {}
    }
    let blocks = blocks_to_check(
        args.prompt.num_tokens,
        args.prompt.block_size,
        block_hashes.len(),
    );
    if blocks == 0 {
        report.warn(
            "prefetch",
            &format!("active (limit {limit}), not tried: the prompt has no full block"),
            "give a prompt of at least one block (--num-tokens, --hashes)",
        );
        return;
    }
    if !reachable {
        report.not_checked(
            "prefetch",
            &format!("active by the settings (limit {limit}), not tried: the store is unreachable"),
        );
        return;
    }
    match prefetch_once(args, block_hashes, timeout).await {
        Ok(Some(took)) => report.ok(
            "prefetch",
            &format!(
                "active (limit {limit}): a lookup started at arrival answered in {}, before \
                 the first probe",
                ms(took)
            ),
        ),
        Ok(None) => report.warn(
            "prefetch",
            &format!(
                "active (limit {limit}), but the lookup started at arrival did not answer \
                 within {} s",
                timeout.as_secs_f64()
            ),
            "a slow or stuck store: see the wire check",
        ),
        Err(e) => report.fail(
            "prefetch",
            &format!("the client refused the settings: {e}"),
            "fix the named setting",
        ),
    }
}

/// One request announced to a real client, then probed once its prefetch ended:
/// how long the prefetch took, or `None` when it had not ended within `timeout`.
async fn prefetch_once(
    args: &DoctorArgs,
    block_hashes: &BlockHashes,
    timeout: Duration,
) -> Result<Option<Duration>, String> {
    let block_size = args.prompt.block_size;
    let mut config = match &args.master.mooncake_master {
        Some(addr) => {
            let layout = args.master.layout().map_err(|f| f.message)?;
            let master = MasterAddr::parse(addr, args.master.mooncake_cluster_id.as_deref())
                .map_err(|e| format!("--mooncake-master: {e}"))?;
            let mut direct = DirectConfig::new(master, layout);
            direct.master_config = args.master.config(timeout);
            // The lease the client goes by until the master reports its own.
            direct.lease_ttl = lookup_core::duration_from_secs(args.lease_ttl_s)
                .map_err(|e| format!("--lease-ttl-s: {e}"))?;
            ClientConfig::new(direct, block_size)
        }
        None => {
            let endpoint = args.target.endpoint().map_err(|f| f.message)?;
            let mut zmq = ZmqConfig::new(endpoint);
            zmq.format = args.format;
            ClientConfig::new(zmq, block_size)
        }
    };
    config.core.lookup_async = true;
    config.core.lookup_prefetch_limit = args.settings.core.lookup_prefetch_limit;
    // `--lookup-prefetch-ttl-s` is checked against the lease by the `ttl` line, its one
    // report. This client times one prefetch read by one probe that never waited for
    // it, so the result must outlive the few steps between its reply and that probe
    // (rule 6 ages a result no probe waited for): 500 ms, below any lease a master
    // grants, so it does not warn about the same cause again.
    config.core.lookup_prefetch_ttl = Duration::from_millis(500);
    config.core.lookup_timeout = timeout;
    let mut client = LookupClient::connect_lazy(config).map_err(|e| e.to_string())?;
    let req = Request {
        request_id: RequestId(1),
        num_tokens: args.prompt.num_tokens,
        block_hashes: block_hashes.clone(),
        skip_reading_external_kv: false,
    };
    let started = Instant::now();
    client.on_new_request(&req);
    let deadline = started + timeout;
    let mut ended = None;
    while ended.is_none() {
        while let Some(event) = client.poll_event() {
            if matches!(event, Event::LookupDone { .. }) {
                ended = Some(started.elapsed());
            }
        }
        let now = Instant::now();
        if ended.is_some() || now >= deadline {
            break;
        }
        client.wait_progress(deadline - now).await;
    }
    let first = client.probe(&req, 0);
    client.on_finished(req.request_id);
    client.shutdown().await;
    Ok(ended.filter(|_| matches!(first, Probe::Ready { .. })))
}
