//! `recap._core`: thin PyO3 bindings over recap-core. Arrays in and out, GIL released while
//! Rust works, one error mapping.

// Nothing reachable from Python may panic on bad input: errors are values. (Tests may unwrap.)
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use pyo3::prelude::*;

mod arrays;
mod batch_width;
mod config;
mod drafter;
mod errors;
mod layout;
mod memory;
mod session;
mod step;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    memory::init(m)?;
    drafter::init(m)?;
    session::init(m)?;
    config::init(m)?;
    layout::init(m)?;
    batch_width::init(m)?;
    Ok(())
}
