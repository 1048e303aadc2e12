//! Prompt lookup decoding with the semantics of transformers' `PromptLookupCandidateGenerator`:
//! for n from `max_ngram` down to 1, find the earliest earlier occurrence of the last n
//! tokens of prompt + output and propose the (up to) `num_tokens` tokens that followed it.
//!
//! transformers rescans the whole sequence every step; here each n-gram's earliest start is
//! indexed once when its last token arrives, so a step costs O(max_ngram).

use rustc_hash::FxHashMap;

use crate::drafter::{Drafter, TopKRows};
use crate::error::{Error, Result};
use crate::memory::MAX_VOCAB;
use crate::token_set::TokenSet;
use crate::tree::{DraftTree, NodeSource};

pub struct PromptLookup {
    max_ngram: usize,
    num_tokens: usize,
    excluded: TokenSet,
    /// index[n-1]: packed n-gram -> its earliest start position.
    index: Vec<FxHashMap<u128, u32>>,
    indexed: usize,
}

const BITS: u32 = MAX_VOCAB.trailing_zeros();

fn pack(tokens: &[u32]) -> u128 {
    tokens
        .iter()
        .fold(0u128, |acc, &t| (acc << BITS) | t as u128)
}

impl PromptLookup {
    /// The longest n-gram that packs into one 128-bit key.
    pub const MAX_NGRAM: usize = (128 / BITS) as usize;
    pub const MAX_TOKENS: usize = 256;

    pub fn new(max_ngram: usize, num_tokens: usize, excluded: TokenSet) -> Result<Self> {
        if !(1..=Self::MAX_NGRAM).contains(&max_ngram) {
            return Err(Error::invalid(
                "max_ngram",
                format!("1..={}", Self::MAX_NGRAM),
                max_ngram,
            ));
        }
        if !(1..=Self::MAX_TOKENS).contains(&num_tokens) {
            return Err(Error::invalid(
                "num_tokens",
                format!("1..={}", Self::MAX_TOKENS),
                num_tokens,
            ));
        }
        Ok(PromptLookup {
            max_ngram,
            num_tokens,
            excluded,
            index: vec![FxHashMap::default(); max_ngram],
            indexed: 0,
        })
    }

    /// Indexes every n-gram that ends in `text[self.indexed..]`.
    fn index_up_to(&mut self, text: &[u32]) {
        for end in self.indexed + 1..=text.len() {
            for n in 1..=self.max_ngram.min(end) {
                let start = end - n;
                self.index[n - 1]
                    .entry(pack(&text[start..end]))
                    .or_insert(start as u32);
            }
        }
        self.indexed = text.len();
    }

    /// The draft transformers would propose after `text` (no EOS handling: the verifier
    /// stops at EOS itself).
    pub fn lookup<'a>(&mut self, text: &'a [u32]) -> &'a [u32] {
        self.index_up_to(text);
        let len = text.len();
        for n in (1..=self.max_ngram.min(len.saturating_sub(1))).rev() {
            let key = pack(&text[len - n..]);
            if let Some(&start) = self.index[n - 1].get(&key) {
                let from = start as usize + n;
                if from < len {
                    return &text[from..(from + self.num_tokens).min(len)];
                }
            }
        }
        &[]
    }
}

impl Drafter for PromptLookup {
    fn name(&self) -> &'static str {
        "pld"
    }
    fn begin_request(&mut self, _context: &[u32]) {
        self.index.iter_mut().for_each(FxHashMap::clear);
        self.indexed = 0;
    }
    fn propose(&mut self, history: &[u32], tree: &mut DraftTree) {
        tree.start(history);
        let draft = self.lookup(history);
        tree.graft_chain(draft, 0.0, &self.excluded, u32::MAX, NodeSource::Suffix);
        tree.into_preorder();
    }
    fn max_nodes(&self) -> usize {
        self.num_tokens
    }
    fn observe(&mut self, _tree: &DraftTree, _rows: &TopKRows<'_>, _committed: &[u32]) {}
    fn parts(&self) -> Vec<(&'static str, usize)> {
        let index = self.bytes() - self.excluded.bytes();
        vec![
            ("request n-gram index", index),
            ("excluded set", self.excluded.bytes()),
        ]
    }

    fn bytes(&self) -> usize {
        self.index
            .iter()
            .map(|m| m.capacity() * (16 + 4 + 8))
            .sum::<usize>()
            + self.excluded.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// transformers' scan, written naively.
    fn naive(text: &[u32], max_ngram: usize, num: usize) -> Vec<u32> {
        let len = text.len();
        for n in (1..=max_ngram.min(len.saturating_sub(1))).rev() {
            let tail = &text[len - n..];
            for idx in 0..=len - n {
                if &text[idx..idx + n] == tail {
                    let (s, e) = (idx + n, (idx + n + num).min(len));
                    if s < e {
                        return text[s..e].to_vec();
                    }
                }
            }
        }
        Vec::new()
    }

    proptest! {
        #[test]
        fn matches_the_naive_scan_after_every_token(
            text in proptest::collection::vec(0u32..6, 1..120),
            max_ngram in 1usize..5,
            num in 1usize..12,
        ) {
            let mut pld = PromptLookup::new(max_ngram, num, TokenSet::new(8)).unwrap();
            for end in 1..=text.len() {
                prop_assert_eq!(pld.lookup(&text[..end]).to_vec(), naive(&text[..end], max_ngram, num));
            }
        }
    }

    #[test]
    fn settings_are_validated() {
        assert!(PromptLookup::new(0, 10, TokenSet::new(8)).is_err());
        assert!(PromptLookup::new(7, 10, TokenSet::new(8)).is_err());
        assert!(PromptLookup::new(2, 0, TokenSet::new(8)).is_err());
    }
}
