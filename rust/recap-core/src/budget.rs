//! Hardware-aware tree size: verify the part of a drafted tree that maximises expected
//! committed tokens per unit of time, E[accepted + 1] / cost(nodes).
//!
//! Every node gets an acceptance probability from an online calibration table (a node is
//! accepted when it lies on the verified path): tree-search nodes are bucketed by their
//! best-first path score, copied-text nodes (suffix chains) by chain depth and match length.
//! Buckets start from a prior (the path score itself; a flat value for chains) and move to
//! the observed rates as evidence accumulates.
//!
//! Nodes are then taken greedily by (optimistic) probability (a node only after its parent,
//! its probability capped by its parent's), and the prefix with the best expected tokens per
//! second wins. `cost[n - 1]` is the time of a verification pass over n tree tokens
//! (root included), measured by the caller.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::error::{Error, Result};
use crate::tree::{children_csr, DraftTree, NodeSource};

const SCORE_BUCKETS: usize = 64;
const CHAIN_DEPTHS: usize = 16;
const MATCH_BUCKETS: usize = 4;
const BUCKETS: usize = SCORE_BUCKETS + CHAIN_DEPTHS * MATCH_BUCKETS;
/// Pseudo-observations the prior is worth.
const PRIOR_WEIGHT: f32 = 2.0;
/// Selection uses optimistic probabilities: the estimate plus this many standard errors
/// (an upper confidence bound). Thinly observed buckets, whose prior from the path score
/// is pessimistic, are then verified, observed and corrected instead of never being tried;
/// well-observed buckets keep their estimate.
const OPTIMISM: f32 = 1.0;
const CHAIN_PRIOR: f32 = 0.3;
/// Counts are halved when a bucket reaches this, so the table follows drift.
const HALF_LIFE: f32 = 2000.0;
/// Every EXPLORE_EVERY-th tree keeps at least the next of EXPLORE_NODES nodes, so buckets the
/// current estimates would never verify still get observed (and can prove themselves), and
/// the caller's cost curve gets real timings at several sizes, not only at the usual one.
const EXPLORE_EVERY: u64 = 8;
const EXPLORE_NODES: [usize; 4] = [8, 16, 24, 32];

#[derive(Clone, Copy, Debug)]
struct Frontier {
    p: f32,
    node: u32,
}
impl PartialEq for Frontier {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Frontier {}
impl PartialOrd for Frontier {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Frontier {
    fn cmp(&self, o: &Self) -> Ordering {
        self.p.total_cmp(&o.p).then(o.node.cmp(&self.node))
    }
}

/// What the last selection predicted (for statistics).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Selection {
    /// Nodes offered by the drafter, root not counted.
    pub offered: usize,
    /// Nodes kept, root not counted.
    pub kept: usize,
    /// Expected accepted nodes among those kept (bonus not counted).
    pub expected: f32,
}

#[derive(Clone, Debug)]
pub struct AutoBudget {
    cost: Vec<f32>,
    hits: Vec<f32>,
    counts: Vec<f32>,
    heap: BinaryHeap<Frontier>,
    prob: Vec<f32>,
    mean: Vec<f32>,
    order: Vec<u32>,
    children_start: Vec<u32>,
    children: Vec<u32>,
    last: Selection,
    trees: u64,
    /// The last ranking's cumulative optimistic and mean expectations.
    gains: Vec<f32>,
    expected: Vec<f32>,
}

impl AutoBudget {
    pub fn new(cost: Vec<f32>) -> Result<Self> {
        let mut b = AutoBudget {
            cost: Vec::new(),
            hits: vec![0.0; BUCKETS],
            counts: vec![0.0; BUCKETS],
            heap: BinaryHeap::new(),
            prob: Vec::new(),
            mean: Vec::new(),
            order: Vec::new(),
            children_start: Vec::new(),
            children: Vec::new(),
            last: Selection::default(),
            trees: 0,
            gains: Vec::new(),
            expected: Vec::new(),
        };
        b.set_cost(cost)?;
        Ok(b)
    }

    /// Replaces the cost curve: `cost[n - 1]` for n = 1, 2, ... tree tokens.
    pub fn set_cost(&mut self, cost: Vec<f32>) -> Result<()> {
        if cost.is_empty() || cost.iter().any(|c| !(c.is_finite() && *c > 0.0)) {
            return Err(Error::invalid(
                "cost",
                "a non-empty list of finite times > 0 (cost[n-1]: a pass over n tokens)",
                format!(
                    "{} values, min {:?}",
                    cost.len(),
                    cost.iter().copied().reduce(f32::min)
                ),
            ));
        }
        self.cost = cost;
        Ok(())
    }

    pub fn cost(&self) -> &[f32] {
        &self.cost
    }
    pub fn last(&self) -> Selection {
        self.last
    }

    fn bucket(tree: &DraftTree, i: usize) -> usize {
        match tree.sources[i] {
            NodeSource::Suffix => {
                let depth = (tree.depths[i] as usize).clamp(1, CHAIN_DEPTHS) - 1;
                // Chains carry the match length that produced them as their score.
                let m = tree.scores[i].max(0.0) as usize;
                let mb = match m {
                    0..=1 => 0,
                    2..=3 => 1,
                    4..=7 => 2,
                    _ => 3,
                };
                SCORE_BUCKETS + depth * MATCH_BUCKETS + mb
            }
            _ => {
                let s = tree.scores[i].max(1e-12);
                ((-4.0 * s.log2()).round().max(0.0) as usize).min(SCORE_BUCKETS - 1)
            }
        }
    }

    fn prior(bucket: usize) -> f32 {
        if bucket < SCORE_BUCKETS {
            (2.0f32).powf(-(bucket as f32) / 4.0)
        } else {
            CHAIN_PRIOR
        }
    }

    /// Calibrated acceptance probability of a bucket.
    pub fn probability(&self, bucket: usize) -> f32 {
        (self.hits[bucket] + PRIOR_WEIGHT * Self::prior(bucket))
            / (self.counts[bucket] + PRIOR_WEIGHT)
    }

    /// The probability plus OPTIMISM standard errors, at most 1.
    fn optimistic(&self, bucket: usize) -> f32 {
        let p = self.probability(bucket);
        let n = self.counts[bucket] + PRIOR_WEIGHT;
        (p + OPTIMISM * (p * (1.0 - p) / n).sqrt()).min(1.0)
    }

    /// Time of a pass over `n` tokens (beyond the curve: extrapolated linearly).
    fn cost_of(&self, n: usize) -> f32 {
        let m = self.cost.len();
        if n <= m {
            return self.cost[n - 1];
        }
        let slope = if m >= 2 {
            (self.cost[m - 1] - self.cost[m - 2]).max(0.0)
        } else {
            0.0
        };
        self.cost[m - 1] + slope * (n - m) as f32
    }

    /// Ranks the tree's nodes best-first by optimistic acceptance probability (a node only
    /// after its parent, its probability capped by its parent's). Returns the cumulative
    /// optimistic expectation: `gains[m]` is the expected accepted nodes when the first m
    /// ranked nodes are verified (`gains[0] = 0`). `keep_ranked` then cuts the tree.
    pub fn rank(&mut self, tree: &DraftTree) -> &[f32] {
        let n = tree.len();
        children_csr(&tree.parents, &mut self.children_start, &mut self.children);
        self.prob.clear();
        self.prob.resize(n, 1.0);
        self.mean.clear();
        self.mean.resize(n, 1.0);
        self.order.clear();
        self.heap.clear();
        self.gains.clear();
        self.gains.push(0.0);
        self.expected.clear();
        self.expected.push(0.0);
        let push_children = |b: &mut Self, v: usize| {
            let (s, e) = (
                b.children_start[v] as usize,
                b.children_start[v + 1] as usize,
            );
            for j in s..e {
                let c = b.children[j] as usize;
                let bucket = Self::bucket(tree, c);
                let p = b.optimistic(bucket).min(b.prob[v]);
                b.prob[c] = p;
                b.mean[c] = b.probability(bucket).min(b.mean[v]);
                b.heap.push(Frontier { p, node: c as u32 });
            }
        };
        push_children(self, 0);
        let (mut optimistic, mut expected) = (0.0f32, 0.0f32);
        while let Some(f) = self.heap.pop() {
            let v = f.node as usize;
            self.order.push(f.node);
            optimistic += f.p;
            expected += self.mean[v];
            self.gains.push(optimistic);
            self.expected.push(expected);
            push_children(self, v);
        }
        &self.gains
    }

    /// Marks in `keep` the root and the first `m` nodes of the last ranking (of a tree of
    /// `n` nodes), and records the selection.
    pub fn keep_ranked(&mut self, m: usize, n: usize, keep: &mut Vec<bool>) {
        let m = m.min(self.order.len());
        keep.clear();
        keep.resize(n, false);
        keep[0] = true;
        for &v in &self.order[..m] {
            keep[v as usize] = true;
        }
        self.last = Selection {
            offered: n - 1,
            kept: m,
            expected: self.expected[m],
        };
    }

    /// Marks in `keep` the nodes of the best prefix (root always kept).
    pub fn select(&mut self, tree: &DraftTree, keep: &mut Vec<bool>) {
        self.rank(tree);
        let explore = self.trees % EXPLORE_EVERY == EXPLORE_EVERY - 1;
        let round = (self.trees / EXPLORE_EVERY) as usize % EXPLORE_NODES.len();
        self.trees += 1;
        let min_keep = if explore { EXPLORE_NODES[round] } else { 0 };
        let mut best = (1.0 / self.cost_of(1), 0usize);
        for kept in 1..self.gains.len() {
            let rate = (1.0 + self.gains[kept]) / self.cost_of(kept + 1);
            if rate > best.0 || kept <= min_keep {
                best = (rate.max(best.0), kept);
            }
        }
        self.keep_ranked(best.1, tree.len(), keep);
    }

    /// Learns from a verified tree: `on_path` lists the accepted node indices.
    pub fn learn(&mut self, tree: &DraftTree, on_path: &[usize]) {
        let mut accepted = vec![false; tree.len()];
        for &i in on_path {
            accepted[i] = true;
        }
        for (i, &hit) in accepted.iter().enumerate().skip(1) {
            let b = Self::bucket(tree, i);
            self.counts[b] += 1.0;
            self.hits[b] += hit as u8 as f32;
            if self.counts[b] >= HALF_LIFE {
                self.counts[b] *= 0.5;
                self.hits[b] *= 0.5;
            }
        }
    }

    /// (bucket kind, key, prior, observed count, calibrated probability) for every bucket
    /// with observations.
    pub fn calibration(&self) -> Vec<(&'static str, u32, f32, f32, f32)> {
        (0..BUCKETS)
            .filter(|&b| self.counts[b] > 0.0)
            .map(|b| {
                let (kind, key) = if b < SCORE_BUCKETS {
                    ("score", b as u32)
                } else {
                    ("chain", (b - SCORE_BUCKETS) as u32)
                };
                (
                    kind,
                    key,
                    Self::prior(b),
                    self.counts[b],
                    self.probability(b),
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::NO_TOKEN;

    /// Root with a chain of `depth` search nodes of path score 0.9^d, plus a sibling of
    /// score 0.01.
    fn chain(depth: usize) -> DraftTree {
        let mut t = DraftTree::default();
        t.reset(1, [NO_TOKEN, NO_TOKEN]);
        let mut v = 0;
        for d in 1..=depth {
            v = t.push(v, 10 + d as u32, 0.9f32.powi(d as i32), NodeSource::Search);
        }
        t.push(0, 99, 0.01, NodeSource::Search);
        t.into_preorder();
        t
    }

    #[test]
    fn flat_costs_keep_every_likely_node_and_steep_costs_keep_few() {
        let t = chain(8);
        let mut keep = Vec::new();
        let mut flat = AutoBudget::new(vec![1.0; 64]).unwrap();
        flat.select(&t, &mut keep);
        assert_eq!(keep.iter().filter(|&&k| k).count(), t.len()); // free nodes: take all
        let mut steep = AutoBudget::new((1..=64).map(|n| n as f32).collect()).unwrap();
        steep.select(&t, &mut keep);
        // Each extra node costs a whole pass: only worth it while E grows faster than cost.
        assert!(steep.last().kept < 3, "{:?}", steep.last());
        assert!(keep[0]);
    }

    #[test]
    fn kept_nodes_form_a_subtree_and_the_choice_is_optimal() {
        let t = chain(6);
        let cost: Vec<f32> = (1..=16).map(|n| 1.0 + 0.2 * n as f32).collect();
        let mut b = AutoBudget::new(cost.clone()).unwrap();
        let mut keep = Vec::new();
        b.select(&t, &mut keep);
        for i in 1..t.len() {
            if keep[i] {
                assert!(keep[t.parents[i] as usize]);
            }
        }
        // Brute force over chain prefixes (the low sibling never pays): same rate.
        let mut probs = Vec::new();
        let mut cap = 1.0f32;
        for i in 1..=6 {
            cap = cap.min(b.optimistic(AutoBudget::bucket(&t, i)));
            probs.push(cap);
        }
        let mut best = 0.0f32;
        for k in 0..=6 {
            let e: f32 = probs[..k].iter().sum::<f32>();
            best = best.max((1.0 + e) / cost[k]);
        }
        let s = b.last();
        let chosen: f32 = probs[..s.kept].iter().sum();
        assert!(((1.0 + chosen) / cost[s.kept] - best).abs() < 1e-5);
    }

    #[test]
    fn a_ranked_prefix_is_a_subtree_with_the_gain_it_was_ranked_at() {
        let t = chain(6);
        let mut b = AutoBudget::new(vec![1.0; 16]).unwrap();
        let gains = b.rank(&t).to_vec();
        assert_eq!(gains.len(), t.len()); // one entry per prefix length, 0 included
        assert!(gains.windows(2).all(|w| w[1] >= w[0]));
        let mut keep = Vec::new();
        for m in 0..t.len() {
            b.keep_ranked(m, t.len(), &mut keep);
            assert_eq!(keep.iter().filter(|&&k| k).count(), m + 1);
            for i in 1..t.len() {
                if keep[i] {
                    assert!(
                        keep[t.parents[i] as usize],
                        "m={m}: node {i} kept without its parent"
                    );
                }
            }
            assert_eq!(b.last().kept, m);
        }
        // The likely chain ranks before the unlikely sibling.
        b.keep_ranked(6, t.len(), &mut keep);
        assert!(keep[..7].iter().all(|&k| k) && !keep[7]);
    }

    #[test]
    fn observed_acceptance_moves_the_calibration() {
        let t = chain(4);
        let mut b = AutoBudget::new(vec![1.0; 8]).unwrap();
        let bucket = AutoBudget::bucket(&t, 1);
        let before = b.probability(bucket);
        for _ in 0..50 {
            b.learn(&t, &[0]); // nothing ever accepted
        }
        assert!(b.probability(bucket) < before / 5.0);
        assert!(b.optimistic(bucket) < before / 2.0); // the doubt shrinks with evidence
        assert!(b.calibration().iter().any(|c| c.3 > 0.0));
        assert!(AutoBudget::new(vec![]).is_err());
        assert!(AutoBudget::new(vec![1.0, f32::NAN]).is_err());
    }
}
