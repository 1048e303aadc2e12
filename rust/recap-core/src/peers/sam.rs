//! SAM-Decoding: a suffix automaton over prompt + output finds the longest suffix that
//! occurred before and proposes what followed its earliest occurrence as a chain of
//! min(max_len, 1 + 4 * match_len) tokens. `SAM[TR]` uses the chain only when the match
//! is at least `threshold` long and a Token Recycling tree otherwise.

use crate::drafter::{Drafter, TopKRows};
use crate::error::{Error, Result};
use crate::peers::TokenRecycling;
use crate::suffix::SuffixAutomaton;
use crate::token_set::TokenSet;
use crate::tree::{DraftTree, NodeSource};

pub struct SamDrafter {
    automaton: SuffixAutomaton,
    max_len: usize,
    excluded: TokenSet,
    fallback: Option<(TokenRecycling, usize)>,
}

impl SamDrafter {
    pub const MAX_LEN: usize = 256;

    /// `fallback`: a Token Recycling drafter and the match length from which the chain wins.
    pub fn new(
        max_len: usize,
        excluded: TokenSet,
        fallback: Option<(TokenRecycling, usize)>,
    ) -> Result<Self> {
        if !(1..=Self::MAX_LEN).contains(&max_len) {
            return Err(Error::invalid(
                "max_len",
                format!("1..={}", Self::MAX_LEN),
                max_len,
            ));
        }
        Ok(SamDrafter {
            automaton: SuffixAutomaton::new(),
            max_len,
            excluded,
            fallback,
        })
    }

    /// Chain length for a match of `match_len` tokens.
    pub fn chain_len(&self, match_len: usize) -> usize {
        self.max_len.min(1 + 4 * match_len)
    }
}

impl Drafter for SamDrafter {
    fn name(&self) -> &'static str {
        if self.fallback.is_some() {
            "sam_tr"
        } else {
            "sam"
        }
    }
    fn begin_request(&mut self, context: &[u32]) {
        self.automaton.clear();
        self.automaton.extend(context);
    }
    fn seed(&mut self, context: &[u32], start: usize, rows: &TopKRows<'_>) {
        if let Some((tr, _)) = &mut self.fallback {
            tr.seed(context, start, rows);
        }
    }
    fn propose(&mut self, history: &[u32], tree: &mut DraftTree) {
        tree.start(history);
        let match_len = self.automaton.longest_match().map_or(0, |m| m.len);
        match &mut self.fallback {
            Some((tr, threshold)) if match_len < *threshold => tr.fill(tree),
            _ => {
                let (chain, _) = self.automaton.continuation(self.chain_len(match_len));
                let score = match_len as f32;
                tree.graft_chain(chain, score, &self.excluded, u32::MAX, NodeSource::Suffix);
            }
        }
        tree.into_preorder();
    }
    fn max_nodes(&self) -> usize {
        let tr = self.fallback.as_ref().map_or(0, |(tr, _)| tr.max_nodes());
        self.max_len.max(tr)
    }
    fn observe(&mut self, tree: &DraftTree, rows: &TopKRows<'_>, committed: &[u32]) {
        if let Some((tr, _)) = &mut self.fallback {
            tr.observe(tree, rows, committed);
        }
        self.automaton.extend(committed);
    }
    fn parts(&self) -> Vec<(&'static str, usize)> {
        let tr = self.fallback.as_ref().map_or(0, |(tr, _)| tr.bytes());
        vec![
            ("request automaton", self.automaton.bytes()),
            ("persistent rows", tr),
            ("excluded set", self.excluded.bytes()),
        ]
    }

    fn bytes(&self) -> usize {
        let tr = self.fallback.as_ref().map_or(0, |(tr, _)| tr.bytes());
        self.automaton.bytes() + self.excluded.bytes() + tr
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_follows_the_longest_match() {
        let mut sam = SamDrafter::new(60, TokenSet::new(32), None).unwrap();
        let text = [1u32, 2, 3, 4, 5, 6, 7, 1, 2];
        sam.begin_request(&text);
        let mut tree = DraftTree::default();
        sam.propose(&text, &mut tree);
        // Match "1 2" (length 2) -> up to 9 tokens after its first occurrence.
        assert_eq!(tree.tokens, vec![2, 3, 4, 5, 6, 7, 1, 2]);
        assert_eq!(sam.chain_len(2), 9);
        assert_eq!(sam.chain_len(100), 60);
    }
}
