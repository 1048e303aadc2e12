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

pub mod accept;
pub mod budget;
pub mod calibration;
pub mod cost;
pub mod drafter;
pub mod engine;
pub mod error;
pub mod fusion;
pub mod memory;
pub mod peers;
pub mod recap;
pub mod search;
pub mod session;
pub mod shared_memory;
pub mod snapshot;
pub mod suffix;
pub mod token_set;
pub mod tree;

pub use accept::{accept_path, Acceptance};
pub use calibration::Calibration;
pub use drafter::{Drafter, TopKRows};
pub use engine::{DraftSource, SharedDrafter};
pub use error::{Error, Result};
pub use fusion::{FusionMode, Priors};
pub use recap::{RecapConfig, RecapDrafter};
pub use search::SearchParams;
pub use session::DraftSession;
pub use shared_memory::SharedMemory;
pub use tree::{DraftTree, NodeSource};
