//! The training-free drafters RECAP is compared against, behind the same `Drafter` trait,
//! session, acceptance and packing, so that only the draft source differs.
//!
//! - `ar`: no draft (plain greedy through the same loop);
//! - `pld`: prompt lookup with transformers' semantics;
//! - `tr`: Token Recycling (adjacency rows kept across requests, static tree template);
//! - `sam`, `sam_tr`: suffix-automaton chains, optionally falling back to a TR tree;
//! - `suffix`: SuffixDecoding-style suffix trees with counts.

mod ar;
mod pld;
mod sam;
mod suffix_tree;
mod tr;

pub use ar::Autoregressive;
pub use pld::PromptLookup;
pub use sam::SamDrafter;
pub use suffix_tree::{SuffixHistory, SuffixTreeConfig, SuffixTreeDrafter};
pub use tr::{TokenRecycling, TR_LEVELS};
