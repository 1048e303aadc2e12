//! Best-first tree search: score(child) = score(parent) * eta(depth(child)) * q_parent(child).
//!
//! Children are pushed lazily: a parent's proposal is sorted, so only its best unexpanded
//! child needs to sit in the heap; popping it pushes the next sibling. The selected set is
//! exactly what eager expansion selects under the same total order
//! (score desc, then parent index asc, then sibling rank asc), with a heap a few entries deep.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::error::{Error, Result};
use crate::fusion::Proposal;
use crate::token_set::TokenSet;
use crate::tree::{DraftTree, NodeSource};

/// Default per-depth factors (depth 1, 2, ...); deeper levels reuse the last one.
pub const DEFAULT_ETA: [f32; 6] = [0.68, 0.63, 0.50, 0.43, 0.40, 0.38];

#[derive(Clone, Debug, PartialEq)]
pub struct SearchParams {
    /// Nodes to select, root not counted.
    pub budget: usize,
    pub max_depth: u32,
    /// eta for depth 1, 2, ...; the last value repeats.
    pub eta: Vec<f32>,
}

impl Default for SearchParams {
    fn default() -> Self {
        SearchParams {
            budget: 63,
            max_depth: 10,
            eta: DEFAULT_ETA.to_vec(),
        }
    }
}

impl SearchParams {
    pub const MAX_BUDGET: usize = 4096;
    pub const MAX_DEPTH: u32 = 256;

    /// A tree budget (`name` says which knob) within 0..=MAX_BUDGET.
    pub fn check_budget(name: &'static str, budget: usize) -> Result<()> {
        if budget > Self::MAX_BUDGET {
            return Err(Error::invalid(
                name,
                format!("0..={}", Self::MAX_BUDGET),
                budget,
            ));
        }
        Ok(())
    }

    pub fn validate(&self) -> Result<()> {
        Self::check_budget("budget", self.budget)?;
        if !(1..=Self::MAX_DEPTH).contains(&self.max_depth) {
            return Err(Error::invalid(
                "max_depth",
                format!("1..={}", Self::MAX_DEPTH),
                self.max_depth,
            ));
        }
        if self.eta.is_empty() || self.eta.iter().any(|&e| !(e > 0.0 && e <= 1.0)) {
            return Err(Error::invalid(
                "eta",
                "a non-empty list of values in (0, 1]",
                format!("{:?}", self.eta),
            ));
        }
        Ok(())
    }

    #[inline]
    pub fn eta(&self, depth: u32) -> f32 {
        let i = (depth as usize).saturating_sub(1).min(self.eta.len() - 1);
        self.eta[i]
    }
}

/// Anything that can give the children distribution of a node from its (prev2, prev, token).
pub trait ProposalSource {
    /// Widest proposal this source returns.
    fn width(&self) -> usize;
    fn children(&mut self, prev2: u32, prev: u32, token: u32, out: &mut Proposal);
}

#[derive(Clone, Copy, Debug)]
struct Candidate {
    score: f32,
    parent: u32,
    rank: u32,
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Candidate {}
impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Candidate {
    /// Greater = popped first.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then(other.parent.cmp(&self.parent))
            .then(other.rank.cmp(&self.rank))
    }
}

/// Reusable state of the best-first builder.
#[derive(Clone, Debug, Default)]
pub struct BestFirst {
    heap: BinaryHeap<Candidate>,
    width: usize,
    ids: Vec<u32>,
    probs: Vec<f32>,
    lens: Vec<u32>,
    proposal: Proposal,
}

/// Whether edge (tokens[parent] -> token) already occurs on the root path of `parent`.
fn edge_on_path(tree: &DraftTree, parent: usize, token: u32) -> bool {
    let from = tree.tokens[parent];
    let mut v = parent;
    while tree.parents[v] >= 0 {
        let u = tree.parents[v] as usize;
        if tree.tokens[u] == from && tree.tokens[v] == token {
            return true;
        }
        v = u;
    }
    false
}

impl BestFirst {
    /// Grows `tree` (which must hold only its root) best-first. Nodes are appended in
    /// selection order; call `DraftTree::into_preorder` afterwards.
    pub fn build<S: ProposalSource>(
        &mut self,
        tree: &mut DraftTree,
        params: &SearchParams,
        excluded: &TokenSet,
        source: &mut S,
    ) {
        debug_assert_eq!(tree.len(), 1);
        self.heap.clear();
        self.width = source.width();
        self.ids.clear();
        self.probs.clear();
        self.lens.clear();
        if params.budget == 0 {
            return;
        }
        let (pp, p) = (tree.root_context[0], tree.root_context[1]);
        self.expand(tree, 0, pp, p, params, excluded, source);
        while tree.len() <= params.budget {
            let Some(c) = self.heap.pop() else { break };
            let parent = c.parent as usize;
            let token = self.ids[parent * self.width + c.rank as usize];
            let node = tree.push(parent, token, c.score, NodeSource::Search);
            if let Some(next) = self.first_valid_child(tree, parent, c.rank + 1, params, excluded) {
                self.heap.push(next);
            }
            let prev = tree.tokens[parent];
            let prev2 = if parent == 0 {
                p
            } else {
                tree.tokens[tree.parents[parent] as usize]
            };
            if tree.depths[node] < params.max_depth {
                self.expand(tree, node, prev2, prev, params, excluded, source);
            } else {
                self.store_empty();
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn expand<S: ProposalSource>(
        &mut self,
        tree: &DraftTree,
        node: usize,
        prev2: u32,
        prev: u32,
        params: &SearchParams,
        excluded: &TokenSet,
        source: &mut S,
    ) {
        debug_assert_eq!(self.lens.len(), node);
        source.children(prev2, prev, tree.tokens[node], &mut self.proposal);
        let n = self.proposal.len().min(self.width);
        self.ids.extend_from_slice(&self.proposal.ids[..n]);
        self.probs.extend_from_slice(&self.proposal.probs[..n]);
        let pad = self.width - n;
        self.ids.extend(std::iter::repeat_n(0, pad));
        self.probs.extend(std::iter::repeat_n(0.0, pad));
        self.lens.push(n as u32);
        if let Some(c) = self.first_valid_child(tree, node, 0, params, excluded) {
            self.heap.push(c);
        }
    }

    fn store_empty(&mut self) {
        self.ids.extend(std::iter::repeat_n(0, self.width));
        self.probs.extend(std::iter::repeat_n(0.0, self.width));
        self.lens.push(0);
    }

    fn first_valid_child(
        &self,
        tree: &DraftTree,
        parent: usize,
        from_rank: u32,
        params: &SearchParams,
        excluded: &TokenSet,
    ) -> Option<Candidate> {
        let base = parent * self.width;
        let depth = tree.depths[parent] + 1;
        let factor = tree.scores[parent] * params.eta(depth);
        (from_rank..self.lens[parent]).find_map(|rank| {
            let token = self.ids[base + rank as usize];
            let q = self.probs[base + rank as usize];
            let ok = q > 0.0 && !excluded.contains(token) && !edge_on_path(tree, parent, token);
            ok.then_some(Candidate {
                score: factor * q,
                parent: parent as u32,
                rank,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::NO_TOKEN;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// A deterministic proposal table keyed by (prev, token) over a tiny vocabulary.
    #[derive(Debug)]
    struct Table {
        rows: HashMap<(u32, u32), Proposal>,
        width: usize,
    }
    impl ProposalSource for Table {
        fn width(&self) -> usize {
            self.width
        }
        fn children(&mut self, _pp: u32, p: u32, t: u32, out: &mut Proposal) {
            *out = self.rows.get(&(p, t)).cloned().unwrap_or_default();
        }
    }

    fn arb_table(vocab: u32, width: usize) -> impl Strategy<Value = Table> {
        let keys: Vec<(u32, u32)> = (0..=vocab)
            .flat_map(|p| (0..vocab).map(move |t| (if p == vocab { NO_TOKEN } else { p }, t)))
            .collect();
        let n = keys.len();
        proptest::collection::vec(
            proptest::collection::vec((0..vocab, 1u32..1_000_000), 0..=width),
            n,
        )
        .prop_map(move |rows| {
            let mut map = HashMap::new();
            for (key, row) in keys.iter().zip(rows) {
                let mut row: Vec<(u32, u32)> = row;
                row.sort_by_key(|&(id, _)| id);
                row.dedup_by_key(|e| e.0);
                let total: u32 = row.iter().map(|e| e.1).sum();
                row.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
                let prop = Proposal {
                    ids: row.iter().map(|e| e.0).collect(),
                    probs: row.iter().map(|e| e.1 as f32 / total as f32).collect(),
                };
                map.insert(*key, prop);
            }
            Table { rows: map, width }
        })
    }

    /// Every valid node of the unbounded search space (to max depth) with its score.
    fn enumerate(
        t: &mut Table,
        params: &SearchParams,
        excluded: &TokenSet,
        root: u32,
        p_root: u32,
    ) -> Vec<(Vec<u32>, f32)> {
        let mut out = Vec::new();
        // (path tokens incl. root, score, prev of last)
        let mut stack = vec![(vec![root], 1.0f32)];
        while let Some((path, score)) = stack.pop() {
            let depth = path.len() as u32 - 1;
            if depth > 0 {
                out.push((path.clone(), score));
            }
            if depth >= params.max_depth {
                continue;
            }
            let last = *path.last().unwrap();
            let prev = if path.len() >= 2 {
                path[path.len() - 2]
            } else {
                p_root
            };
            let mut prop = Proposal::default();
            t.children(NO_TOKEN, prev, last, &mut prop);
            for (&tok, &q) in prop.ids.iter().zip(prop.probs.iter()) {
                let repeated = path.windows(2).any(|w| w[0] == last && w[1] == tok);
                if q <= 0.0 || excluded.contains(tok) || repeated {
                    continue;
                }
                let mut child = path.clone();
                child.push(tok);
                stack.push((child, score * params.eta(depth + 1) * q));
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn best_first_selects_the_top_scoring_nodes_of_exhaustive_enumeration(
            mut table in arb_table(4, 3),
            budget in 0usize..12,
            max_depth in 1u32..5,
            root in 0u32..4,
            excluded_tok in proptest::option::of(0u32..4),
        ) {
            let params = SearchParams { budget, max_depth, eta: vec![0.9, 0.7, 0.5] };
            let excluded = TokenSet::from_ids(4, excluded_tok.as_slice());
            let mut tree = DraftTree::default();
            tree.reset(root, [NO_TOKEN, NO_TOKEN]);
            BestFirst::default().build(&mut tree, &params, &excluded, &mut table);
            let mut all = enumerate(&mut table, &params, &excluded, root, NO_TOKEN);
            all.sort_by(|a, b| b.1.total_cmp(&a.1));
            let take = budget.min(all.len());
            prop_assert_eq!(tree.len() - 1, take);
            if take == 0 { return Ok(()); }
            let cutoff = all[take - 1].1;
            // Ties at the cutoff may be broken either way; everything strictly above is selected.
            let got: Vec<Vec<u32>> = (1..tree.len())
                .map(|i| tree.path_to(i).iter().map(|&j| tree.tokens[j]).collect())
                .collect();
            for (path, score) in &all {
                if *score > cutoff {
                    prop_assert!(got.contains(path), "missing {:?} ({})", path, score);
                }
            }
            for (i, path) in got.iter().enumerate() {
                let want = all.iter().find(|(p, _)| p == path).map(|e| e.1);
                prop_assert_eq!(want, Some(tree.scores[i + 1]));
                prop_assert!(tree.scores[i + 1] >= cutoff);
            }
        }
    }

    #[test]
    fn budget_and_depth_bound_the_tree() {
        struct Chain;
        impl ProposalSource for Chain {
            fn width(&self) -> usize {
                2
            }
            fn children(&mut self, _: u32, _: u32, t: u32, out: &mut Proposal) {
                out.ids = vec![t + 1, t + 2];
                out.probs = vec![0.9, 0.1];
            }
        }
        let params = SearchParams {
            budget: 5,
            max_depth: 3,
            eta: vec![0.5],
        };
        let mut tree = DraftTree::default();
        tree.reset(0, [NO_TOKEN, NO_TOKEN]);
        BestFirst::default().build(&mut tree, &params, &TokenSet::new(16), &mut Chain);
        assert_eq!(tree.len(), 6);
        assert!(tree.depths.iter().all(|&d| d <= 3));
        // The top-1 chain comes first in selection order.
        assert_eq!(&tree.tokens[..4], &[0, 1, 2, 3]);
    }

    #[test]
    fn invalid_params_are_reported() {
        let p = SearchParams {
            budget: 5,
            max_depth: 0,
            eta: vec![0.5],
        };
        assert!(p.validate().unwrap_err().to_string().contains("max_depth"));
        let p = SearchParams {
            budget: 5,
            max_depth: 3,
            eta: vec![1.5],
        };
        assert!(p.validate().unwrap_err().to_string().contains("eta"));
    }
}
