//! The `keys` check against a Mooncake master: does the store hold any key of the
//! configured layout at all?
//!
//! The master cannot list the keys under a prefix cheaply and without side effects
//! over its RPC: `GetReplicaListByRegex` scans every key and grants a read lease to
//! each one it matches (Mooncake `master_service.cpp`), and the read-only
//! `GET /get_all_keys` is on the admin HTTP port (`-metrics_port`), which an
//! `etcd://` address does not name. So the check asks `BatchExistKey` about the
//! first block only: its keys under the configured layout, and in the same call its
//! namespace-0 key under the common alternatives a writer may use (the model's last
//! path component, which vLLM puts in its keys, or the full name; with and without
//! the cache prefix; TP ranks 0-7 and PP ranks 0-3). A found alternative names the
//! writer's model, prefix and rank layout. Each present key gets a read lease, as any
//! lookup's does: one block's worth.

use lookup_core::BlockHashes;
use lookup_server::mooncake_master::key::KeyFormat;
use lookup_server::mooncake_master::{KeyLayout, MasterClient, RankNamespace};

use super::Report;
use crate::args::RankSizes;

/// Largest tensor-parallel size the alternatives scan.
const MAX_TP: u32 = 8;
/// Largest pipeline-parallel size the alternatives scan.
const MAX_PP: u32 = 4;
/// Largest prefill context-parallel size the alternatives scan.
const MAX_PCP: u32 = 2;

/// The namespaces the alternatives scan: TP ranks 0-7, PP ranks 0-3, PCP ranks 0-1,
/// and every DCP rank a TP rank can carry (`dcp_rank = tp_rank % dcp_size`, so at most
/// `tp_rank`).
fn scan_namespaces() -> Vec<RankNamespace> {
    let mut out = Vec::new();
    for pcp_rank in 0..MAX_PCP {
        for tp_rank in 0..MAX_TP {
            for dcp_rank in 0..=tp_rank {
                for pp_rank in 0..MAX_PP {
                    out.push(RankNamespace {
                        tp_rank,
                        pcp_rank,
                        dcp_rank,
                        pp_rank,
                        group: 0,
                    });
                }
            }
        }
    }
    out
}

/// The sizes whose namespaces are exactly `found` (the namespaces holding the first
/// block), or `None` when no sizes give that set: advice must make the lookup ask
/// every rank that holds a shard, or it claims blocks some rank lacks (vLLM #46855).
fn sizes_of(found: &[RankNamespace]) -> Option<RankSizes> {
    let max = |f: fn(&RankNamespace) -> u32| found.iter().map(f).max().map(|m| m + 1);
    let sizes = RankSizes {
        tp: max(|ns| ns.tp_rank)?,
        pp: max(|ns| ns.pp_rank)?,
        dcp: max(|ns| ns.dcp_rank)?,
        pcp: max(|ns| ns.pcp_rank)?,
    };
    let mut want = sizes.namespaces().ok()?;
    let mut have = found.to_vec();
    want.sort_by_key(|ns| (ns.pcp_rank, ns.tp_rank, ns.dcp_rank, ns.pp_rank));
    have.sort_by_key(|ns| (ns.pcp_rank, ns.tp_rank, ns.dcp_rank, ns.pp_rank));
    (want == have).then_some(sizes)
}

/// One way a writer may name its keys: the part before the rank namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Naming {
    cache_prefix: Option<String>,
    model: String,
}

impl Naming {
    fn describe(&self) -> String {
        match &self.cache_prefix {
            Some(prefix) => format!("model {}, cache prefix {prefix}", self.model),
            None => format!("model {}, no cache prefix", self.model),
        }
    }
}

/// The model and cache-prefix forms to try, the configured one first.
fn namings(layout: &KeyLayout) -> Vec<Naming> {
    let configured = layout.cache_prefix().filter(|p| !p.is_empty());
    let model = layout.model();
    let mut models = vec![model.to_owned()];
    if let Some((_, last)) = model.rsplit_once('/')
        && !last.is_empty()
    {
        models.push(last.to_owned());
    }
    let mut prefixes = vec![configured.map(str::to_owned)];
    if configured.is_some() {
        prefixes.push(None);
    }
    let mut out = Vec::new();
    for model in &models {
        for prefix in &prefixes {
            out.push(Naming {
                cache_prefix: prefix.clone(),
                model: model.clone(),
            });
        }
    }
    out
}

/// Prints the `keys` line: `ok` when every namespace key of the first block exists
/// under the configured layout; `fail` with the writer's layout when it exists only
/// under an alternative ("no key with this prefix"), or when only some of the
/// configured namespaces hold it (a rank layout that differs); `warn` when no
/// alternative holds it either (a cold cache, or a layout the scan does not know).
pub(crate) async fn check(
    report: &mut Report,
    master: &MasterClient,
    layout: &KeyLayout,
    block_hashes: &BlockHashes,
) {
    let Some(first) = block_hashes.get(0) else {
        report.warn(
            "keys",
            "no block hash given: the store's keys were not checked",
            "give the hashes of a prompt the engines stored (--hashes or --hashes-file)",
        );
        return;
    };
    let configured = layout.block_keys(first);
    let namings = namings(layout);
    let grid = scan_namespaces();
    let mut keys = configured.clone();
    for naming in &namings {
        let format = KeyFormat::new(naming.cache_prefix.as_deref(), &naming.model, &grid);
        keys.extend(format.block_keys(first));
    }
    let answers = match master.batch_exist(&keys).await {
        Ok(answers) => answers,
        Err(e) => {
            report.fail(
                "keys",
                &format!("the existence query failed: {e}"),
                "check the master (see reachability)",
            );
            return;
        }
    };
    let (mine, scanned) = answers.split_at(configured.len());
    let prefix = KeyFormat::new(layout.cache_prefix(), layout.model(), layout.namespaces());
    // vLLM's prefix and the `@` before the hash: what every key of the block starts with.
    let prefix = format!("{}@", prefix.prefix(0).unwrap_or_default());
    let present = mine.iter().filter(|&&p| p).count();
    // The namespaces of the configured naming that hold the first block.
    let found_here: Vec<RankNamespace> = grid
        .iter()
        .zip(scanned.iter().take(grid.len()))
        .filter(|&(_, &present)| present)
        .map(|(ns, _)| *ns)
        .collect();
    let unasked: Vec<RankNamespace> = found_here
        .iter()
        .filter(|ns| !layout.namespaces().contains(ns))
        .copied()
        .collect();
    if present == configured.len() && !unasked.is_empty() {
        // Ranks the layout does not ask hold shards too: a lookup under this layout
        // claims blocks that those ranks may lack (vLLM #46855).
        let fix = sizes_of(&found_here).map_or_else(
            || "set the writers' parallel sizes by hand".to_owned(),
            RankSizes::flags,
        );
        report.fail(
            "keys",
            &format!(
                "the first block is stored under prefix {prefix}, and also in namespaces \
                 the layout does not ask (the writers' ranks are {}): the lookup would \
                 claim blocks those ranks lack",
                describe_ranks(&found_here)
            ),
            &fix,
        );
        return;
    }
    if present == configured.len() {
        report.ok(
            "keys",
            &format!(
                "the first block is stored under the configured layout ({present} of \
                 {present} namespace keys, prefix {prefix})"
            ),
        );
        return;
    }
    // Which naming holds the block, and in which namespaces.
    let found = namings
        .iter()
        .zip(scanned.chunks(grid.len()))
        .find_map(|(naming, flags)| {
            let ranks: Vec<RankNamespace> = grid
                .iter()
                .zip(flags)
                .filter(|&(_, &present)| present)
                .map(|(ns, _)| *ns)
                .collect();
            (!ranks.is_empty()).then_some((naming, ranks))
        });
    let Some((naming, ranks)) = found else {
        report.warn(
            "keys",
            &format!(
                "no key of the first block under prefix {prefix} nor under {} alternative \
                 model names, cache prefixes and rank layouts: a cold cache, or a layout \
                 this check does not try",
                namings.len() * grid.len() - 1
            ),
            "check that the engines stored this prompt, and the writers' model name, \
             cache prefix and ranks",
        );
        return;
    };
    let same_naming = naming.model == layout.model()
        && naming.cache_prefix.as_deref() == layout.cache_prefix().filter(|p| !p.is_empty());
    let mut fix = Vec::new();
    if naming.model != layout.model() {
        fix.push(format!("--model {}", naming.model));
    }
    if naming.cache_prefix.as_deref() != layout.cache_prefix().filter(|p| !p.is_empty()) {
        fix.push(match &naming.cache_prefix {
            Some(p) => format!("--cache-prefix {p}"),
            None => "no --cache-prefix".to_owned(),
        });
    }
    // The advice is checked before it is printed: the advised flags' namespaces must be
    // exactly the ones holding the block, so that the lookup asks every shard.
    let ranks_found = describe_ranks(&ranks);
    let Some(sizes) = sizes_of(&ranks) else {
        report.fail(
            "keys",
            &format!(
                "the first block is stored as {} in namespaces {ranks_found}, which no \
                 --tp-size, --pp-size, --dcp-size and --pcp-size give",
                naming.describe()
            ),
            "set the writers' parallel sizes by hand (a layout this check does not know: \
             MLA, store TP, several KV-cache groups)",
        );
        return;
    };
    let advised = sizes.namespaces().unwrap_or_default();
    if advised != layout.namespaces() {
        fix.push(sizes.flags());
    }
    let finding = if same_naming {
        format!(
            "{present} of {} namespace keys of the first block exist under prefix {prefix}: \
             the writers' rank layout is {ranks_found}",
            configured.len()
        )
    } else {
        format!(
            "no key with this prefix: {prefix} (the first block is stored as {}, \
             {ranks_found})",
            naming.describe()
        )
    };
    report.fail("keys", &finding, &fix.join(" "));
}

/// `tp 2, pp 1` (and `, dcp 2`, `, pcp 2` when above 1) of the ranks holding a key,
/// from their highest ranks.
fn describe_ranks(found: &[RankNamespace]) -> String {
    let max = |f: fn(&RankNamespace) -> u32| found.iter().map(f).max().unwrap_or(0) + 1;
    let mut out = format!("tp {}, pp {}", max(|ns| ns.tp_rank), max(|ns| ns.pp_rank));
    for (name, size) in [
        ("dcp", max(|ns| ns.dcp_rank)),
        ("pcp", max(|ns| ns.pcp_rank)),
    ] {
        if size > 1 {
            out.push_str(&format!(", {name} {size}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namings_try_the_last_path_component_and_no_prefix() {
        let layout = KeyLayout::new("Qwen/Qwen3-8B").with_cache_prefix(Some("vllm".to_owned()));
        let forms: Vec<String> = namings(&layout).iter().map(Naming::describe).collect();
        assert_eq!(
            forms,
            [
                "model Qwen/Qwen3-8B, cache prefix vllm",
                "model Qwen/Qwen3-8B, no cache prefix",
                "model Qwen3-8B, cache prefix vllm",
                "model Qwen3-8B, no cache prefix",
            ]
        );
        let plain: Vec<String> = namings(&KeyLayout::new("m"))
            .iter()
            .map(Naming::describe)
            .collect();
        assert_eq!(plain, ["model m, no cache prefix"]);
    }
}

#[cfg(test)]
mod advice {
    use super::*;

    fn ns(tp_rank: u32, dcp_rank: u32) -> RankNamespace {
        RankNamespace {
            tp_rank,
            dcp_rank,
            ..RankNamespace::default()
        }
    }

    #[test]
    fn advice_names_every_rank_that_holds_a_shard() {
        // TP 2 x DCP 2: tp 0 holds dcp 0, tp 1 holds dcp 1.
        let sizes = sizes_of(&[ns(0, 0), ns(1, 1)]).unwrap();
        assert_eq!(sizes.flags(), "--tp-size 2 --pp-size 1 --dcp-size 2");
        assert_eq!(
            sizes_of(&[ns(0, 0), ns(1, 0)]).unwrap().flags(),
            "--tp-size 2 --pp-size 1"
        );
        // Only rank 0 holds the first block: its sizes are TP 1.
        assert_eq!(
            sizes_of(&[ns(0, 0)]).unwrap().flags(),
            "--tp-size 1 --pp-size 1"
        );
        // A set no sizes give is never advised (here tp 1 without its dcp 0 sibling).
        assert_eq!(sizes_of(&[ns(0, 0), ns(1, 1), ns(1, 0)]), None);
        assert_eq!(sizes_of(&[ns(1, 1)]), None);
        assert_eq!(describe_ranks(&[ns(0, 0), ns(1, 1)]), "tp 2, pp 1, dcp 2");
    }
}
