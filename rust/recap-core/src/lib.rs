//! Host-side hot paths of RECAP speculative decoding.
//!
//! A `SharedDrafter` (configuration, shared memory, cross-request structures; `Sync`) opens
//! one `DraftSession` per request. The flow of one step: `DraftSession::propose` (fused
//! lookups -> best-first tree -> suffix graft -> preorder), the caller verifies the tree
//! with the target model, then `DraftSession::observe` (acceptance -> memory update ->
//! suffix automaton append); `DraftSession::finish` hands the request's lasting state back.

// Nothing reachable from Python may panic on bad input: errors are values. (Tests may unwrap.)
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

// The modules are the crate's own; what other crates (the Python bindings, the benches) use
// is the curated list below.
mod accept;
mod batch_width;
mod budget;
mod calibration;
mod cost;
mod drafter;
mod engine;
mod error;
mod fusion;
mod memory;
pub mod peers;
mod pool;
mod recap;
mod search;
mod session;
mod shared_memory;
mod skinny;
mod snapshot;
mod source_scale;
mod suffix;
mod token_set;
mod transpose;
mod tree;

pub use accept::{accept_path, Acceptance};
pub use batch_width::BatchWidth;
pub use budget::{AutoBudget, Selection};
pub use calibration::{BudgetState, Calibration};
pub use cost::CostCurve;
pub use drafter::{Drafter, TopKRows};
pub use engine::{DraftSource, SharedDrafter};
pub use error::{check_tokens, Error, Result};
pub use fusion::{FusionMode, Priors, Proposal};
pub use memory::{UnigramTable, MAX_VOCAB};
pub use pool::{use_openmp, uses_openmp};
pub use recap::{RecapConfig, RecapDrafter};
pub use search::{SearchParams, DEFAULT_ETA};
pub use session::DraftSession;
pub use shared_memory::{SharedMemory, MAX_K};
pub use skinny::{skinny_is_vectorised, skinny_matmul};
pub use snapshot::{Expect as SnapshotExpect, Header as SnapshotHeader};
pub use suffix::SuffixAutomaton;
pub use token_set::TokenSet;
pub use transpose::transpose_into;
pub use tree::{DraftTree, NodeSource};

/// The header of a memory snapshot file (checked, without reading the rows into a table).
pub fn snapshot_header(path: &std::path::Path) -> Result<SnapshotHeader> {
    snapshot::header(&snapshot::read(path)?)
}
