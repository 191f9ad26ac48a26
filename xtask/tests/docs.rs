//! The repository's docs stay true to the tree: every `*.md` file a tracked file
//! names is in the repository, DESIGN.md's dependency table is `cargo metadata`'s,
//! every ```rust block of the README is an example the tests run, and the README's
//! other first examples (the vLLM operator's configuration, the simulator's commands)
//! are read by the code that reads them (CONTRIBUTING.md rules 22 and 23).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The files git tracks, as paths from the root.
fn tracked() -> BTreeSet<String> {
    let out = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root())
        .output()
        .expect("git ls-files (the test reads the tracked files)");
    assert!(out.status.success(), "git ls-files failed");
    String::from_utf8(out.stdout)
        .unwrap()
        .split('\0')
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The `*.md` names in `text` that stand on their own (not inside a URL or a longer
/// path): `spec/wire.md`, `../RELIABILITY.md`, `METRICS.md`.
fn md_citations(text: &str) -> Vec<&str> {
    let part = |c: char| c.is_ascii_alphanumeric() || "_./-".contains(c);
    let mut found = Vec::new();
    for (at, _) in text.match_indices(".md") {
        let end = at + 3;
        if text[end..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            continue; // `.mdx`, `.md_file`
        }
        let start = text[..at]
            .char_indices()
            .rev()
            .take_while(|&(_, c)| part(c))
            .last()
            .map_or(at, |(i, _)| i);
        let before = text[..start].chars().next_back();
        if start == at || before == Some(':') {
            continue; // `.md` alone, or a URL's path (`https://host/x.md`)
        }
        found.push(&text[start..end]);
    }
    found
}

/// Normalises `dir/name` (`a/b/../c.md` is `a/c.md`), or `None` above the root.
fn join(dir: &Path, name: &str) -> Option<String> {
    let path = dir.join(name);
    let mut parts: Vec<&str> = Vec::new();
    for part in path.to_str()?.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            p => parts.push(p),
        }
    }
    Some(parts.join("/"))
}

#[test]
fn every_cited_markdown_file_is_in_the_repository() {
    let files = tracked();
    let mut missing = Vec::new();
    // This file's own examples of citations are not citations.
    for file in files.iter().filter(|f| *f != "xtask/tests/docs.rs") {
        let Ok(text) = std::fs::read_to_string(root().join(file)) else {
            continue; // binary
        };
        let dir = Path::new(file).parent().unwrap_or(Path::new(""));
        for cited in md_citations(&text) {
            let from_file = join(dir, cited);
            let from_root = join(Path::new(""), cited);
            if ![from_file, from_root]
                .iter()
                .flatten()
                .any(|p| files.contains(p))
            {
                missing.push(format!("{file} cites {cited}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "cited but not in the repository:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_citation_scan_finds_paths_and_skips_urls() {
    let text = "see spec/wire.md, [x](../RELIABILITY.md) and <https://h/a/b.md>; a.mdx";
    assert_eq!(md_citations(text), ["spec/wire.md", "../RELIABILITY.md"]);
}

/// DESIGN.md's "What depends on what": crate -> (dependencies, dev-dependencies).
type Edges = BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)>;

fn design_table() -> Edges {
    let design = read("DESIGN.md");
    let start = design
        .find("| crate | depends on | and in its tests only |")
        .expect("DESIGN.md's dependency table");
    let cells = |cell: &str| -> BTreeSet<String> {
        cell.split(',')
            .map(str::trim)
            .filter(|c| *c != "—")
            .map(str::to_owned)
            .collect()
    };
    design[start..]
        .lines()
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            let row: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            assert_eq!(row.len(), 3, "{line}");
            (row[0].to_owned(), (cells(row[1]), cells(row[2])))
        })
        .collect()
}

fn metadata_edges() -> Edges {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let packages = meta["packages"].as_array().unwrap();
    let ours: BTreeSet<&str> = packages
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    packages
        .iter()
        .map(|p| {
            let (mut normal, mut dev) = (BTreeSet::new(), BTreeSet::new());
            for dep in p["dependencies"].as_array().unwrap() {
                let name = dep["name"].as_str().unwrap();
                if !ours.contains(name) {
                    continue;
                }
                match dep["kind"].as_str() {
                    Some("dev") => dev.insert(name.to_owned()),
                    _ => normal.insert(name.to_owned()),
                };
            }
            (p["name"].as_str().unwrap().to_owned(), (normal, dev))
        })
        .collect()
}

#[test]
fn the_design_dependency_table_is_cargo_metadatas() {
    assert_eq!(design_table(), metadata_edges());
}

/// The bodies of the ```rust blocks of `markdown`.
fn rust_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut rest = markdown;
    while let Some(at) = rest.find("```rust\n") {
        let body = &rest[at + 8..];
        let end = body.find("```").expect("an unclosed ```rust block");
        blocks.push(body[..end].to_owned());
        rest = &body[end + 3..];
    }
    blocks
}

#[test]
fn every_rust_block_of_the_readme_is_an_example_the_tests_run() {
    // Each of these examples checks that the README shows it verbatim, and runs.
    let examples = [
        "crates/lookup-tokio/examples/quick_start.rs",
        "crates/lookup-tokio/examples/router_quick_start.rs",
    ];
    let sources: Vec<String> = examples.iter().map(|e| read(e)).collect();
    let blocks = rust_blocks(&read("README.md"));
    assert_eq!(
        blocks.len(),
        examples.len(),
        "one block per section's example"
    );
    for (block, example) in blocks.iter().zip(examples) {
        assert!(
            sources.iter().any(|s| s.contains(block.as_str())),
            "a README block is not in {example}:\n{block}"
        );
    }
}

/// The README's `vllm serve` line: its `kv_connector_extra_config`, as the library
/// reads it (strictly: an unknown or mistyped key is an error).
#[test]
fn the_readme_vllm_configuration_is_read_by_the_library() {
    let readme = read("README.md");
    let start = readme
        .find("--kv-transfer-config '")
        .expect("the vllm serve example")
        + 22;
    let json = &readme[start..start + readme[start..].find("'\n").unwrap()];
    let transfer: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(transfer["kv_connector"], "MooncakeLookupConnector");
    assert_eq!(transfer["kv_connector_module_path"], "mooncake_lookup.vllm");
    let extra = &transfer["kv_connector_extra_config"];
    let config = lookup_tokio::KvConnectorExtraConfig::from_kv_connector_extra_config(extra)
        .expect("the README's extra config is valid")
        .core(16);
    assert!(config.lookup_async);
    assert_eq!(config.lookup_prefetch_limit, 16);
    assert_eq!(
        config.lookup_prefetch_ttl,
        std::time::Duration::from_secs(2)
    );
    assert_eq!(config.lookup_timeout, std::time::Duration::from_secs(5));
}

#[derive(Parser)]
struct Simulate {
    #[command(flatten)]
    args: xtask::simulate::Args,
}

/// Every `cargo xtask simulate ...` line of the README parses with the simulator's
/// own flags (`--help` aside, which exits).
#[test]
fn the_readme_simulator_commands_parse() {
    let readme = read("README.md");
    let lines: Vec<&str> = readme
        .lines()
        .filter(|l| l.starts_with("cargo xtask simulate"))
        .map(|l| l.split(" #").next().unwrap().trim())
        .filter(|l| !l.ends_with("--help"))
        .collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    for line in lines {
        let words = line.split_whitespace().skip(2); // "cargo xtask"
        if let Err(e) = Simulate::try_parse_from(words) {
            panic!("{line}: {e}");
        }
    }
}
