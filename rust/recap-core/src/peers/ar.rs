//! Plain greedy decoding through the speculative loop: every tree is the root alone.

use crate::drafter::{Drafter, TopKRows};
use crate::tree::DraftTree;

#[derive(Clone, Copy, Debug, Default)]
pub struct Autoregressive;

impl Drafter for Autoregressive {
    fn name(&self) -> &'static str {
        "ar"
    }
    fn begin_request(&mut self, _context: &[u32]) {}
    fn propose(&mut self, history: &[u32], tree: &mut DraftTree) {
        tree.start(history);
    }
    fn max_nodes(&self) -> usize {
        0
    }
    fn observe(&mut self, _tree: &DraftTree, _rows: &TopKRows<'_>, _committed: &[u32]) {}
    fn bytes(&self) -> usize {
        0
    }
}
