//! Project tasks, reached as `cargo xtask <task>`.
fn main() {
    println!("cargo xtask simulate: not built yet");
}
