//! `recap._core`: thin PyO3 bindings over recap-core. Arrays in and out, GIL released while
//! Rust works, one error mapping.

use pyo3::prelude::*;

mod arrays;
mod config;
mod drafter;
mod errors;
mod step;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    drafter::init(m)?;
    config::init(m)?;
    Ok(())
}
