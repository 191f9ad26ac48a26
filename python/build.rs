//! Emits pyo3's cfgs for the interpreter the package is built against
//! (`Py_LIMITED_API` with the `abi3` feature, `PyPy`, `GraalPy`), so that
//! `src/hashes.rs` reads CPython's objects directly only where their layout is part of
//! the ABI built for.

fn main() {
    pyo3_build_config::use_pyo3_cfgs();
}
