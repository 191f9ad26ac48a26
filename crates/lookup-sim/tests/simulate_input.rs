//! `cargo xtask simulate --trace FILE` on a file with a bad line: the error names the
//! file, the mode that read it and the line and column.

use clap::Parser;
use lookup_sim::Args;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: Args,
}

#[test]
fn a_bad_trace_line_is_named_with_its_file_and_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("t.jsonl");
    std::fs::write(
        &path,
        "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [1, 2]}\n{oops}\n",
    )
    .expect("write");
    let path_text = path.display().to_string();
    let cli = Cli::try_parse_from([
        "simulate",
        "--no-plot",
        "--no-recommend",
        "--repeats",
        "1",
        "--modes",
        "sync",
        "--trace",
        &path_text,
    ])
    .expect("flags");
    let mut out = Vec::new();
    let err = lookup_sim::run_to(&cli.args, &mut out).expect_err("a bad line");
    assert_eq!(
        format!("{err:#}"),
        format!(
            "{path_text}: sync mode: line 2, column 2: not a trace record (key must be a string)"
        )
    );
}
