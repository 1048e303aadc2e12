//! The interface every drafter implements, and the per-node rows the verifier hands back.

use crate::error::{check_tokens, Error, Result};
use crate::tree::DraftTree;

/// Top-K rows, one per position: `ids[i*k..(i+1)*k]`, `probs[i*k..(i+1)*k]` (full-softmax
/// probabilities of those ids).
#[derive(Clone, Copy, Debug)]
pub struct TopKRows<'a> {
    pub ids: &'a [u32],
    pub probs: &'a [f32],
    pub k: usize,
}

impl<'a> TopKRows<'a> {
    /// Checks shapes, ids against the vocabulary and probabilities for finiteness and sign.
    pub fn new(
        ids: &'a [u32],
        probs: &'a [f32],
        k: usize,
        rows: usize,
        vocab_size: usize,
    ) -> Result<Self> {
        if k == 0 {
            return Err(Error::invalid("top-k width", "k >= 1", 0));
        }
        if ids.len() != rows * k || probs.len() != rows * k {
            return Err(Error::ShapeMismatch {
                name: "top-k rows",
                expected: format!("ids and probs of {rows} x {k}"),
                got: format!("{} ids and {} probs", ids.len(), probs.len()),
            });
        }
        check_tokens("top-k ids", ids, vocab_size)?;
        if let Some(&bad) = probs.iter().find(|p| !(p.is_finite() && **p >= 0.0)) {
            return Err(Error::invalid(
                "top-k probs",
                "finite probabilities >= 0",
                bad,
            ));
        }
        Ok(TopKRows { ids, probs, k })
    }

    pub fn rows(&self) -> usize {
        self.ids.len() / self.k
    }

    #[inline]
    pub fn row(&self, i: usize) -> (&'a [u32], &'a [f32]) {
        let r = i * self.k..(i + 1) * self.k;
        (&self.ids[r.clone()], &self.probs[r])
    }
}

/// A draft source. The session owns the committed history and the acceptance; a drafter
/// only proposes trees and learns from what the target computed.
pub trait Drafter: Send + Sync {
    fn name(&self) -> &'static str;

    /// A request starts with these committed tokens (prompt, usually plus the first
    /// generated token). Request-local state is reset here.
    fn begin_request(&mut self, context: &[u32]);

    /// Rows the prefill computed: row i is the target's continuation after
    /// `context[start + i]` (a prefill may seed only the prompt's last positions).
    fn seed(&mut self, _context: &[u32], _start: usize, _rows: &TopKRows<'_>) {}

    /// Builds a tree rooted at the last committed token into `tree`, in preorder.
    fn propose(&mut self, history: &[u32], tree: &mut DraftTree);

    /// The most nodes a tree can hold, root not counted (bounds the verifier's buffers).
    fn max_nodes(&self) -> usize;

    /// After verification: `rows` holds one row per tree node (preorder), `committed` the
    /// tokens this step committed after the root (accepted nodes, then the bonus).
    fn observe(&mut self, tree: &DraftTree, rows: &TopKRows<'_>, committed: &[u32]);

    /// Heap bytes held (shared memories included once per holder).
    fn bytes(&self) -> usize;

    /// `bytes()` by structure, for the bounds benchmark (one entry by default).
    fn parts(&self) -> Vec<(&'static str, usize)> {
        vec![("total", self.bytes())]
    }

    /// The request is over: hand what outlives it (an output for a cross-request structure)
    /// to the shared drafter. Called once per request, before the next `begin_request`.
    fn end_request(&mut self) {}
}
