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

/// Largest tensor-parallel size the alternatives scan.
const MAX_TP: u32 = 8;
/// Largest pipeline-parallel size the alternatives scan.
const MAX_PP: u32 = 4;

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
    let grid = RankNamespace::grid(MAX_TP, MAX_PP);
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
    let prefix = prefix.prefix(0).unwrap_or_default().to_owned();
    let present = mine.iter().filter(|&&p| p).count();
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
    let tp_size = ranks.iter().map(|ns| ns.tp_rank).max().unwrap_or(0) + 1;
    let pp_size = ranks.iter().map(|ns| ns.pp_rank).max().unwrap_or(0) + 1;
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
    let configured_grid = layout.namespaces();
    if RankNamespace::grid(tp_size, pp_size) != configured_grid {
        fix.push(format!("--tp-size {tp_size} --pp-size {pp_size}"));
    }
    let finding = if same_naming {
        format!(
            "{present} of {} namespace keys of the first block exist under prefix {prefix}: \
             the writers' rank layout is tp {tp_size}, pp {pp_size}",
            configured.len()
        )
    } else {
        format!(
            "no key with this prefix: {prefix} (the first block is stored as {}, tp \
             {tp_size}, pp {pp_size})",
            naming.describe()
        )
    };
    report.fail("keys", &finding, &fix.join(" "));
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
