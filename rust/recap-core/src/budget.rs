//! Hardware-aware tree size: verify the part of a drafted tree that maximises expected
//! committed tokens per unit of time, E[accepted + 1] / cost(nodes).
//!
//! Every node gets an acceptance probability from an online calibration table (a node is
//! accepted when it lies on the verified path). Tree-search nodes are bucketed by their
//! best-first path score, and their bucket's rate is their probability (capped by their
//! parent's). Copied-text nodes (suffix chains) are priced by how often a chain holds one
//! more token once it held up to its parent: a hold rate per chain depth and length of the
//! match that produced the chain (a chain after a 40-token match breaks far less often than
//! one after a 4-token match), and a node's probability is its parent's times that rate. The
//! rate of a depth not yet observed is the rate of its match length over every depth, so a
//! long copy's 40th token is priced from how its first 20 held, not from a guess that would
//! never let it be verified. After a short match, chain nodes the memory's search also
//! proposed (`Agreed`) have buckets of their own: on open text such a copy whose token the
//! memory does not predict holds far less often than one it does. Buckets start from a
//! prior (the path score itself; for chains, a hold rate that grows with the match) and move
//! to the observed rates as evidence accumulates.
//!
//! Nodes are then taken greedily by (optimistic) probability (a node only after its parent),
//! and the prefix with the best expected tokens per
//! second wins. `cost[n - 1]` is the time of a verification pass over n tree tokens
//! (root included), measured by the caller.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::error::{Error, Result};
use crate::source_scale::{SourceScale, KINDS};
use crate::tree::{
    children_csr, frequent_parts, DraftTree, NodeSource, FREQUENT_MATCHES, SHORT_CHAIN_MATCH,
};

const SCORE_BUCKETS: usize = 64;
/// Chain depths 1-16 one by one, then 17-24, 25-32, ..., 57-64 and beyond.
const CHAIN_DEPTHS: usize = 22;
/// Match lengths 0-1, 2-3, 4-7, 8-15, 16-31, 32 and more.
const MATCH_BUCKETS: usize = 6;
/// Chain buckets of one kind (copied alone, or also proposed by the memory).
const CHAIN_BUCKETS: usize = CHAIN_DEPTHS * MATCH_BUCKETS;
/// Frequency-tree nodes: levels of their path probability p, round(-4 log2 p) (p >= 0.1,
/// the tree's floor, is level 13 or less), per match class (`tree::FREQUENT_MATCHES`: a
/// count after a one-token match is weaker evidence than one after eight), alone and where
/// the memory's search agreed.
const FREQ_LEVELS: usize = 16;
const FREQ_KIND: usize = FREQ_LEVELS * FREQUENT_MATCHES;
const FREQ_START: usize = SCORE_BUCKETS + 2 * CHAIN_BUCKETS;
const BUCKETS: usize = FREQ_START + 2 * FREQ_KIND;
/// Where each source kind's buckets start (search scores, chains copied alone, chains the
/// memory also proposed, frequency-tree nodes alone and agreed), and their names.
const KIND_START: [usize; KINDS] = [
    0,
    SCORE_BUCKETS,
    SCORE_BUCKETS + CHAIN_BUCKETS,
    FREQ_START,
    FREQ_START + FREQ_KIND,
];
const KIND_NAMES: [&str; KINDS] = ["score", "chain", "agreed", "frequent", "frequent_agreed"];
/// Pooled chain rates: per kind and match bucket.
const POOLS: usize = 2 * MATCH_BUCKETS;
/// Chain nodes the memory also proposed are priced apart after matches shorter than 8
/// tokens (the first three match buckets): a short match is weak evidence, and whether the
/// memory predicts the same token tells a copy from a coincidence; a longer match is
/// evidence enough, and splitting its observations only thins them (in modeled time, 70
/// prompts, splitting every match length cost the long copies 5-11%).
/// The same bound as the frequency tree's over short copies (`tree::SHORT_CHAIN_MATCH`).
const AGREEMENT_MATCHES: usize = SHORT_CHAIN_MATCH.ilog2() as usize;
// Match buckets are floor(log2(match)): the two bounds agree only at a power of two.
const _: () = assert!(SHORT_CHAIN_MATCH.is_power_of_two());
/// The prior hold rate of a chain (its next token, given the chain held so far), per match
/// bucket.
const CHAIN_HOLD: [f32; MATCH_BUCKETS] = [0.5, 0.6, 0.7, 0.8, 0.88, 0.93];
/// Pseudo-observations the prior is worth.
const PRIOR_WEIGHT: f32 = 2.0;
/// Ranking uses optimistic probabilities: the estimate plus this many standard errors
/// (an upper confidence bound), so the order in which nodes are taken favours the thinly
/// observed; the size of the prefix is then chosen by the calibrated means (by the bounds
/// it bought trees that did not pay: modeled on a 2-core VM's curve over the 30 shipped
/// prompts, 2.358x against 2.340x, humaneval 1.552x against 1.497x, 3.4 against 4.4 nodes
/// per step on open text; on a flat curve 4.670x against 4.673x), and exploration (below)
/// verifies past it. Thinly observed buckets, whose prior is pessimistic, are
/// then verified, observed and corrected instead of never being tried; well-observed buckets
/// keep their estimate. Where that optimism does not pay in a request, the backoff below
/// stops drafting. Half a standard error: a whole one bought marginal trees on open text
/// (a bucket seen 30 times at 0.2 priced at 0.27). In modeled time (benches/modeled_budget.py,
/// 70 prompts) 0.5 committed 1.9% and 0.4% more per pass time than 1.0 in two pairs of
/// runs, copying unchanged; 0, 0.25 and 0.75 were within 0.5% of it, and 0 cost long copies
/// 5% (docs/results/modeled-budget.md).
const OPTIMISM: f32 = 0.5;
/// The backoff, per request: the realized gain of the steps that drafted (accepted + 1
/// tokens for a pass costing c(n) / c(1) one-token steps, by the controller's own curve) is
/// kept as an average with weight REALIZED_EMA; once BACKOFF_AFTER drafted steps have been
/// judged and it is below BACKOFF_BELOW (drafting loses to plain decoding), the request
/// drafts nothing
/// for the next pause (BACKOFF_FIRST steps, doubling on each pause that follows another, up
/// to BACKOFF_MAX), then drafts again: a stretch of open text stops costing within a few
/// steps, and a stretch of copying that follows is found at the next try. A try after a
/// pause is judged after BACKOFF_RETRY drafted steps, from a neutral average: each failed
/// try costs that many dear passes (on a CPU a 10-17-node tree costs about two one-token
/// steps and, on open text, accepts about one node), so open text that never pays loses
/// half as much to tries as with the first judgement's four steps.
/// BACKOFF_BELOW is 1, not a margin above it: the gain is priced by the curve that sized
/// the trees, so a margin cannot cover that curve's error; it only paused drafting that
/// paid. 1.05 cost 3.0% of modeled time over 70 prompts on a flat curve (SmolLM2 with the
/// swapped product: a 4-token pass at 1.05x one token) and 0.6% on the steep one
/// (docs/results/pauses.md).
/// The gain is measured, not modeled, wherever the caller reports step times
/// (`observe_step`): the committed tokens times the measured time of an undrafted step over
/// the measured time of this one, so a cost curve that is wrong (a point taken while the
/// machine was busy, one kept from another process) can neither keep a losing request
/// drafting nor pause one that pays. An undrafted step's time is an average (weight
/// PLAIN_EMA) of this budget's one-token steps: pauses provide them, and a step verifies the
/// root alone to measure one when none was timed yet, or when the last is PLAIN_STALE steps
/// old and the step's best tree is not a holding copy. Without timings the curve prices the gain.
const PLAIN_EMA: f32 = 0.2;
const PLAIN_STALE: u32 = 256;
const REALIZED_EMA: f32 = 0.25;
const BACKOFF_BELOW: f32 = 1.0;
const BACKOFF_AFTER: u32 = 4;
const BACKOFF_RETRY: u32 = 2;
const BACKOFF_FIRST: u32 = 8;
const BACKOFF_MAX: u32 = 64;
/// A pause holds back marginal drafting only: a step whose best choice is expected (by the
/// calibrated mean, not the optimistic bound) to commit this many times a one-token step's
/// output per unit of time (a long copy whose chain holds) drafts during a pause, so the
/// copying that follows open text is not missed.
const PAUSE_OVERRIDE: f32 = 1.5;
/// During a pause, a tree whose pass costs at most this many undrafted steps still drafts
/// (what the curve's first-use points cannot tell apart from an undrafted step).
const FREE_MARGIN: f32 = 1.03;
/// Counts are halved when a bucket reaches this, so the table follows drift.
const HALF_LIFE: f32 = 2000.0;
/// Exploration: a tree may keep more nodes than the estimates pay for (the next of
/// EXPLORE_NODES, in turn), so buckets the current estimates would never verify still get
/// observed (and can prove themselves), and the caller's cost curve gets real timings at
/// several sizes. What that costs beyond the best choice is paid from a credit that grows by
/// EXPLORE_SHARE of every chosen pass's time, so exploring never costs more than that share
/// of the decoding time: often where extra nodes are nearly free (an accelerator), rarely
/// where each one costs (a CPU), and not at all when the tree offers nothing to try.
const EXPLORE_SHARE: f32 = 0.02;
const EXPLORE_NODES: [usize; 4] = [8, 16, 24, 32];
/// The credit saved up is capped at this many best passes (no burst of exploration after a
/// long quiet stretch).
const EXPLORE_CREDIT_CAP: f32 = 4.0;

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

/// The per-request backoff state (see BACKOFF_AFTER).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Backoff {
    /// Average realized gain of the drafted steps since the last pause.
    realized: f32,
    /// Drafted steps judged since the last pause.
    judged: u32,
    /// Steps left in the current pause.
    pause_left: u32,
    /// The next pause's length.
    next_pause: u32,
    /// The last selection explored (its steps are not judged: they draft past what pays).
    explored: bool,
    /// Pauses so far in this request.
    pauses: u32,
    /// The last verified step drafted (nodes, committed tokens) and awaits its time.
    pending: Option<(usize, usize)>,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            realized: 1.0,
            judged: 0,
            pause_left: 0,
            next_pause: BACKOFF_FIRST,
            explored: false,
            pauses: 0,
            pending: None,
        }
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
    /// Chain observations per kind and match bucket, over every depth (the depth buckets'
    /// prior).
    pooled_hits: [f32; POOLS],
    pooled_counts: [f32; POOLS],
    heap: BinaryHeap<Frontier>,
    prob: Vec<f32>,
    mean: Vec<f32>,
    order: Vec<u32>,
    children_start: Vec<u32>,
    children: Vec<u32>,
    /// One node's children while they are priced: (optimistic, mean, node).
    siblings: Vec<(f32, f32, u32)>,
    last: Selection,
    explored: usize,
    credit: f32,
    /// The last ranking's cumulative optimistic and mean expectations.
    gains: Vec<f32>,
    expected: Vec<f32>,
    backoff: Backoff,
    /// Measured time of an undrafted step (0: none yet) and steps since the last one.
    plain_s: f32,
    plain_age: u32,
    /// Whether steps report their times (then the backoff judges by them).
    timed: bool,
    /// Whether the last selection drafted what costs no more than an undrafted step, during
    /// a pause, and the measured time of such steps (0: none yet).
    free_step: bool,
    free_s: f32,
    /// The nodes the last step's floor added (scratch).
    floor_added: Vec<u32>,
    /// This request's correction per source kind, and per node of the last ranking its
    /// kind and the correction its price carries (a chain inherits its start's).
    scale: SourceScale,
    node_kind: Vec<u8>,
    node_scale: Vec<f32>,
}

impl AutoBudget {
    pub fn new(cost: Vec<f32>) -> Result<Self> {
        let mut b = AutoBudget {
            cost: Vec::new(),
            hits: vec![0.0; BUCKETS],
            counts: vec![0.0; BUCKETS],
            pooled_hits: [0.0; POOLS],
            pooled_counts: [0.0; POOLS],
            heap: BinaryHeap::new(),
            prob: Vec::new(),
            mean: Vec::new(),
            order: Vec::new(),
            children_start: Vec::new(),
            children: Vec::new(),
            siblings: Vec::new(),
            last: Selection::default(),
            explored: 0,
            credit: 0.0,
            gains: Vec::new(),
            expected: Vec::new(),
            backoff: Backoff::default(),
            plain_s: 0.0,
            plain_age: 0,
            timed: false,
            free_step: false,
            free_s: 0.0,
            floor_added: Vec::new(),
            scale: SourceScale::default(),
            node_kind: Vec::new(),
            node_scale: Vec::new(),
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
            source @ (NodeSource::Suffix | NodeSource::Agreed) => {
                // Chains carry the match length that produced them as their score.
                let m = tree.scores[i].max(0.0) as usize;
                let mb = (usize::BITS - (m | 1).leading_zeros()) as usize - 1; // floor(log2)
                let depth = Self::depth_bucket(tree.depths[i] as usize);
                let kind = (source == NodeSource::Agreed && mb < AGREEMENT_MATCHES) as usize;
                SCORE_BUCKETS
                    + kind * CHAIN_BUCKETS
                    + depth * MATCH_BUCKETS
                    + mb.min(MATCH_BUCKETS - 1)
            }
            source @ (NodeSource::Frequent | NodeSource::FrequentAgreed) => {
                let (p, class) = frequent_parts(tree.scores[i]);
                let level =
                    ((-4.0 * p.clamp(1e-12, 1.0).log2()).round() as usize).min(FREQ_LEVELS - 1);
                FREQ_START
                    + (source == NodeSource::FrequentAgreed) as usize * FREQ_KIND
                    + class * FREQ_LEVELS
                    + level
            }
            _ => {
                let s = tree.scores[i].max(1e-12);
                ((-4.0 * s.log2()).round().max(0.0) as usize).min(SCORE_BUCKETS - 1)
            }
        }
    }

    fn depth_bucket(depth: usize) -> usize {
        let d = depth.max(1);
        if d <= 16 {
            d - 1
        } else {
            (16 + (d - 17) / 8).min(CHAIN_DEPTHS - 1)
        }
    }

    /// A bucket's source kind (an index of KIND_START, `source_scale::KINDS`).
    fn kind(bucket: usize) -> usize {
        KIND_START
            .iter()
            .rposition(|&start| bucket >= start)
            .unwrap_or(0)
    }

    fn is_chain(bucket: usize) -> bool {
        (SCORE_BUCKETS..FREQ_START).contains(&bucket)
    }

    fn match_bucket(bucket: usize) -> usize {
        (bucket - SCORE_BUCKETS) % MATCH_BUCKETS
    }

    /// A chain bucket's pool: its kind and match bucket.
    fn pool(bucket: usize) -> usize {
        (bucket - SCORE_BUCKETS) / CHAIN_BUCKETS * MATCH_BUCKETS + Self::match_bucket(bucket)
    }

    /// A score bucket's prior acceptance; a chain bucket's prior hold rate (its match
    /// bucket's rate over every depth, itself starting from CHAIN_HOLD).
    fn prior(&self, bucket: usize) -> f32 {
        if bucket >= FREQ_START {
            // The tree's own probability; calibration moves it to what such nodes earn.
            let level = (bucket - FREQ_START) % FREQ_LEVELS;
            return (2.0f32).powf(-(level as f32) / 4.0);
        }
        if !Self::is_chain(bucket) {
            return (2.0f32).powf(-(bucket as f32) / 4.0);
        }
        let (m, pool) = (Self::match_bucket(bucket), Self::pool(bucket));
        (self.pooled_hits[pool] + PRIOR_WEIGHT * CHAIN_HOLD[m])
            / (self.pooled_counts[pool] + PRIOR_WEIGHT)
    }

    /// Calibrated rate of a bucket: a score bucket's acceptance probability, a chain
    /// bucket's hold rate.
    pub fn probability(&self, bucket: usize) -> f32 {
        (self.hits[bucket] + PRIOR_WEIGHT * self.prior(bucket))
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
        self.node_kind.clear();
        self.node_kind.resize(n, u8::MAX);
        self.node_scale.clear();
        self.node_scale.resize(n, 1.0);
        self.expected.clear();
        self.expected.push(0.0);
        self.order.clear();
        self.heap.clear();
        self.gains.clear();
        self.gains.push(0.0);
        // Siblings are exclusive (at most one child of a node is accepted), so their
        // probabilities share the parent's: taken in order of their own, each is capped by
        // what the ones before it left. A chain that holds keeps its price and the tree's
        // other guesses at its depth are priced by what it leaves, instead of each by its
        // bucket's average as if the chain were not there.
        let push_children = |b: &mut Self, v: usize| {
            let (s, e) = (
                b.children_start[v] as usize,
                b.children_start[v + 1] as usize,
            );
            b.siblings.clear();
            for j in s..e {
                let c = b.children[j] as usize;
                let bucket = Self::bucket(tree, c);
                let kind = Self::kind(bucket);
                // This request's correction applies where a source's guess starts (a chain
                // below its own start inherits it through its parent's price).
                let continues = Self::is_chain(bucket) && b.node_kind[v] == kind as u8;
                let f = if continues { 1.0 } else { b.scale.factor(kind) };
                b.node_kind[c] = kind as u8;
                b.node_scale[c] = if !Self::is_chain(bucket) {
                    f
                } else {
                    b.node_scale[v] * f
                };
                let priced = if Self::is_chain(bucket) {
                    (
                        b.prob[v] * b.optimistic(bucket) * f,
                        b.mean[v] * b.probability(bucket) * f,
                    )
                } else {
                    (b.optimistic(bucket) * f, b.probability(bucket) * f)
                };
                let priced = (priced.0.min(1.0), priced.1.min(1.0));
                b.siblings.push((priced.0, priced.1, c as u32));
            }
            b.siblings
                .sort_unstable_by(|x, y| y.0.total_cmp(&x.0).then(x.2.cmp(&y.2)));
            let (mut left_p, mut left_mean) = (b.prob[v], b.mean[v]);
            for &(p, mean, c) in &b.siblings {
                // The optimistic price is capped by the parent's less its earlier siblings'
                // means (their estimates, not their optimism), so an upper bound on one
                // guess does not starve the next of the trial it needs.
                let (p, mean) = (p.min(left_p), mean.min(left_mean));
                left_p = (left_p - mean).max(0.0);
                left_mean -= mean;
                b.prob[c as usize] = p;
                b.mean[c as usize] = mean;
                b.heap.push(Frontier { p, node: c });
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

    /// Counts a kept node of the last ranking at what the table alone expected of it, for
    /// this request's correction.
    fn expect_kept(&mut self, v: usize) {
        let kind = self.node_kind[v] as usize;
        if kind < KINDS {
            let raw = self.mean[v] / self.node_scale[v].max(1e-6);
            self.scale.expect(kind, raw.min(1.0));
        }
    }

    /// Marks in `keep` the root and the first `m` nodes of the last ranking (of a tree of
    /// `n` nodes), and records the selection.
    pub fn keep_ranked(&mut self, m: usize, n: usize, keep: &mut Vec<bool>) {
        let m = m.min(self.order.len());
        keep.clear();
        keep.resize(n, false);
        keep[0] = true;
        for j in 0..m {
            let v = self.order[j] as usize;
            keep[v] = true;
            self.expect_kept(v);
        }
        self.last = Selection {
            offered: n - 1,
            kept: m,
            expected: self.expected[m],
        };
    }

    /// Marks in `keep` the nodes of the best prefix (root always kept), or, when the
    /// exploration credit covers its extra cost, the next exploration size.
    pub fn select(&mut self, tree: &DraftTree, keep: &mut Vec<bool>) {
        self.rank(tree);
        self.free_step = false;
        // Drafting nothing is priced by what an undrafted step measured, where one was timed:
        // on a CPU a one-token pass can cost more than a two-token one (another product, or
        // the cache's heads copied where a pass of several tokens groups them), which the
        // non-decreasing curve cannot show.
        let plain = self.undrafted_cost();
        let best = self.best_prefix(plain, f32::INFINITY);
        let mean_rate = (1.0 + self.expected[best.1]) / self.cost_of(best.1 + 1);
        let holding_copy = mean_rate * plain >= PAUSE_OVERRIDE;
        // A pause neither explores nor spends the credit: its steps verify the best choice
        // or nothing, and are judged as such.
        let (chosen, drafting) = if self.plain_needed(holding_copy) {
            (0, false) // measure what an undrafted step costs (see PLAIN_EMA)
        } else if self.backoff.pause_left > 0 {
            self.backoff.pause_left -= 1;
            self.backoff.explored = false;
            if holding_copy {
                (best.1, true)
            } else {
                // What costs no more than an undrafted step still drafts: on a CPU where a
                // 2-token pass costs what a 1-token one does, a pause that verified the
                // root alone threw its one likely guess away (SmolLM2, a first request:
                // 71 of 106 steps undrafted). Such steps are not judged (they cost what the
                // pause costs), but they are timed: once they measure dearer than an
                // undrafted step, the pause drafts nothing (a curve that is wrong cannot
                // make it draft).
                let free = self.free_prefix(plain);
                self.backoff.explored = free > 0;
                self.free_step = free > 0;
                (free, false)
            }
        } else {
            let chosen = self.explore(best.1);
            self.backoff.explored = chosen > best.1;
            (chosen, true)
        };
        self.keep_ranked(chosen, tree.len(), keep);
        if drafting {
            self.keep_floor(tree, keep);
        }
    }

    /// (tokens per second, nodes) of the ranked prefix with the best expected rate among
    /// those whose pass costs at most `limit`, against an undrafted step costing `plain`
    /// (0 nodes where none beats it). By the calibrated means: the optimism orders the
    /// nodes, it does not pay for them.
    fn best_prefix(&self, plain: f32, limit: f32) -> (f32, usize) {
        let mut best = (1.0 / plain, 0usize);
        for kept in 1..self.expected.len() {
            let cost = self.cost_of(kept + 1);
            if cost > limit {
                break; // the curve does not fall
            }
            let rate = (1.0 + self.expected[kept]) / cost;
            if rate > best.0 {
                best = (rate, kept);
            }
        }
        best
    }

    /// The best prefix whose pass costs at most FREE_MARGIN undrafted steps, unless such
    /// steps have measured dearer; 0 where none pays.
    fn free_prefix(&self, plain: f32) -> usize {
        if self.timed && self.free_s > FREE_MARGIN * self.plain_s {
            return 0;
        }
        self.best_prefix(plain, FREE_MARGIN * plain).1
    }

    /// Adds the tree's floor nodes (`DraftTree::floor`) and their paths to the selection just
    /// made, then, in rank order, the nodes a pass of that size gets for nothing (the curve
    /// prices sizes between its points at the next point's time); kept where the floor pays
    /// as a whole by the calibrated means (its nodes' own buckets, learned from the floor
    /// nodes verified so far): a floor a ranked prefix could not reach without nodes ranked
    /// above it is judged on its own, and one that costs more than it earns (where every
    /// node costs a pass) is left out.
    fn keep_floor(&mut self, tree: &DraftTree, keep: &mut [bool]) {
        let (kept, expected) = (self.last.kept, self.last.expected);
        let mut added = std::mem::take(&mut self.floor_added);
        added.clear();
        for i in (1..tree.len()).filter(|&i| tree.floor[i]) {
            // Preorder: walking up from a floor node stops at the first kept ancestor.
            let mut v = i;
            while !keep[v] {
                keep[v] = true;
                added.push(v as u32);
                v = tree.parents[v] as usize;
            }
        }
        if !added.is_empty() {
            let price = self.cost_of(kept + added.len() + 1);
            for &v in &self.order {
                if self.cost_of(kept + added.len() + 2) > price {
                    break;
                }
                if !keep[v as usize] {
                    keep[v as usize] = true;
                    added.push(v);
                }
            }
            let gain: f32 = added.iter().map(|&v| self.mean[v as usize]).sum();
            let before = if kept == 0 {
                1.0 / self.undrafted_cost()
            } else {
                (1.0 + expected) / self.cost_of(kept + 1)
            };
            if (1.0 + expected + gain) / self.cost_of(kept + added.len() + 1) >= before {
                self.last.kept += added.len();
                self.last.expected += gain;
                for &v in &added {
                    self.expect_kept(v as usize);
                }
            } else {
                for &v in &added {
                    keep[v as usize] = false;
                }
            }
        }
        self.floor_added = added;
    }

    /// A new request: its backoff starts afresh (the calibration carries over).
    pub fn begin_request(&mut self) {
        self.backoff = Backoff::default();
        self.scale.reset();
    }

    /// Pauses of drafting in this request so far (for statistics).
    pub fn pauses(&self) -> u32 {
        self.backoff.pauses
    }

    /// Whether the next step should verify the root alone to time an undrafted step.
    fn plain_needed(&self, holding_copy: bool) -> bool {
        self.timed && (self.plain_s <= 0.0 || (self.plain_age >= PLAIN_STALE && !holding_copy))
    }

    /// What an undrafted step costs: its measured time, else the curve's c(1).
    fn undrafted_cost(&self) -> f32 {
        self.plain_s().unwrap_or(self.cost[0])
    }

    /// The measured time of an undrafted step, if one was timed.
    pub fn plain_s(&self) -> Option<f32> {
        (self.plain_s > 0.0).then_some(self.plain_s)
    }

    /// The step just learned from took `step_s` (its verification pass over `tokens` tokens
    /// plus its host work): an undrafted step updates the undrafted time, a drafted one is
    /// judged by its measured gain.
    pub fn observe_step(&mut self, tokens: usize, step_s: f64) {
        let step_s = step_s as f32;
        if !(step_s.is_finite() && step_s > 0.0) {
            return;
        }
        self.timed = true;
        // Averages of step times (weight PLAIN_EMA), started by their first step.
        let average = |avg: f32| {
            if avg > 0.0 {
                avg + PLAIN_EMA * (step_s - avg)
            } else {
                step_s
            }
        };
        if std::mem::take(&mut self.free_step) {
            self.free_s = average(self.free_s);
        }
        if tokens <= 1 {
            self.backoff.pending = None;
            self.plain_s = average(self.plain_s);
            self.plain_age = 0;
            return;
        }
        if let Some((n, committed)) = self.backoff.pending.take() {
            if n == tokens {
                self.judge_gain(committed as f32 * self.undrafted_cost() / step_s);
            }
        }
    }

    /// Judges a drafted step by the curve when no time came for it.
    fn judge_pending_by_the_curve(&mut self) {
        if let Some((n, committed)) = self.backoff.pending.take() {
            self.judge_gain(committed as f32 * self.cost[0] / self.cost_of(n));
        }
    }

    /// A verified step: `accepted + 1` tokens for a pass over `n` tokens. Where steps report
    /// their times, a drafted one is judged when its time comes (`observe_step`, or by the
    /// curve at the next step if none came); elsewhere by the curve at once.
    fn judge(&mut self, n: usize, committed: usize) {
        self.judge_pending_by_the_curve();
        self.plain_age = self.plain_age.saturating_add(1);
        if n <= 1 || self.backoff.explored {
            return;
        }
        self.backoff.pending = Some((n, committed));
        if !self.timed {
            self.judge_pending_by_the_curve();
        }
    }

    /// One drafted step's realized gain over plain decoding, into the backoff.
    fn judge_gain(&mut self, gain: f32) {
        let b = &mut self.backoff;
        b.realized += REALIZED_EMA * (gain - b.realized);
        b.judged += 1;
        if b.judged < BACKOFF_AFTER {
            return;
        }
        if b.realized < BACKOFF_BELOW {
            b.pause_left = b.next_pause;
            b.next_pause = (2 * b.next_pause).min(BACKOFF_MAX);
            b.pauses += 1;
            b.realized = BACKOFF_BELOW;
            b.judged = BACKOFF_AFTER - BACKOFF_RETRY;
        } else {
            b.next_pause = BACKOFF_FIRST; // drafting pays again: the next pause starts short
        }
    }

    /// The nodes to keep given the best choice `best`: `best`, or more when exploring.
    fn explore(&mut self, best: usize) -> usize {
        let pass = self.cost_of(best + 1);
        self.credit = (self.credit + EXPLORE_SHARE * pass).min(EXPLORE_CREDIT_CAP * pass);
        let offered = self.order.len();
        let size = EXPLORE_NODES[self.explored % EXPLORE_NODES.len()].min(offered);
        if size <= best {
            return best;
        }
        let extra = self.cost_of(size + 1) - pass;
        if extra > EXPLORE_CREDIT_CAP * pass {
            self.explored += 1; // never affordable here: try the next size next time
            return best;
        }
        if extra > self.credit {
            return best;
        }
        self.credit -= extra;
        self.explored += 1;
        size
    }

    /// Learns from a verified tree: `on_path` lists the accepted node indices (root first).
    pub fn learn(&mut self, tree: &DraftTree, on_path: &[usize]) {
        self.judge(tree.len(), on_path.len());
        let mut accepted = vec![false; tree.len()];
        for &i in on_path {
            accepted[i] = true;
        }
        let hit_of = |h: bool| h as u8 as f32;
        let mut by_kind = [0.0f32; KINDS];
        for (i, &hit) in accepted.iter().enumerate().skip(1) {
            let b = Self::bucket(tree, i);
            by_kind[Self::kind(b)] += hit_of(hit);
            if Self::is_chain(b) {
                // A hold rate: observed only where the chain held up to the parent.
                if !accepted[tree.parents[i] as usize] {
                    continue;
                }
                let pool = Self::pool(b);
                self.pooled_counts[pool] += 1.0;
                self.pooled_hits[pool] += hit_of(hit);
                if self.pooled_counts[pool] >= HALF_LIFE {
                    self.pooled_counts[pool] *= 0.5;
                    self.pooled_hits[pool] *= 0.5;
                }
            }
            self.counts[b] += 1.0;
            self.hits[b] += hit_of(hit);
            if self.counts[b] >= HALF_LIFE {
                self.counts[b] *= 0.5;
                self.hits[b] *= 0.5;
            }
        }
        self.scale.observe(&by_kind);
    }

    /// (bucket kind, key, prior, observed count, calibrated rate) for every bucket with
    /// observations: "score" buckets give acceptance probabilities, "chain" buckets (key:
    /// depth bucket x 6 + match bucket) and "agreed" buckets (the same key, for chain nodes
    /// the memory's search also proposed) hold rates, "frequent" and "frequent_agreed"
    /// buckets (key: match class x 16 + round(-4 log2 p) of the frequency tree's
    /// probability) acceptance probabilities.
    pub fn calibration(&self) -> Vec<(&'static str, u32, f32, f32, f32)> {
        (0..BUCKETS)
            .filter(|&b| self.counts[b] > 0.0)
            .map(|b| {
                let kind = Self::kind(b);
                (
                    KIND_NAMES[kind],
                    (b - KIND_START[kind]) as u32,
                    self.prior(b),
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
    use crate::tree::{frequent_score, NO_TOKEN};

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

    /// Root with a chain of `len` search nodes so unlikely that no prefix of it pays.
    fn unlikely_chain(len: u32) -> DraftTree {
        let mut t = DraftTree::default();
        t.reset(1, [NO_TOKEN, NO_TOKEN]);
        let mut v = 0;
        for d in 1..=len {
            v = t.push(v, 10 + d, 1e-6, NodeSource::Search);
        }
        t.into_preorder();
        t
    }

    /// Root with one suffix chain of `len` tokens, copied after a 40-token match.
    fn copy_chain(len: u32) -> DraftTree {
        let mut t = DraftTree::default();
        t.reset(1, [NO_TOKEN, NO_TOKEN]);
        let mut v = 0;
        for d in 1..=len {
            v = t.push(v, 10 + d, 40.0, NodeSource::Suffix);
        }
        t.into_preorder();
        t
    }

    #[test]
    fn the_floor_is_kept_where_it_pays_and_filled_to_the_next_point() {
        // An unlikely chain (no prefix of it pays by its price) and an unlikely sibling.
        let mut t = unlikely_chain(5);
        t.push(0, 77, 1e-6, NodeSource::Search);
        t.into_preorder();
        let first = (1..t.len()).find(|&i| t.tokens[i] == 11).unwrap();
        let second = (1..t.len())
            .find(|&i| t.parents[i] == first as i32)
            .unwrap();
        t.floor[first] = true;
        let mut keep = Vec::new();
        // Where a 2-token pass costs what a 1-token pass does, the floor costs nothing.
        let mut b = AutoBudget::new(vec![1.0, 1.0, 1.6, 1.6, 3.0, 3.0, 3.0, 3.0]).unwrap();
        b.select(&t, &mut keep);
        assert!(keep[first]);
        assert_eq!(b.last().kept, 1); // a third token would cost more: nothing rides along
                                      // Where every token costs a pass, a floor that earns nothing is left out.
        let mut dear = AutoBudget::new((1..=8).map(|n| n as f32).collect()).unwrap();
        dear.select(&t, &mut keep);
        assert_eq!(dear.last().kept, 0);
        assert_eq!(keep.iter().filter(|&&k| k).count(), 1);
        // Two floor nodes make a 3-token pass, priced as 4 (the next point's time): the
        // next ranked node rides free.
        t.floor[second] = true;
        let mut stepped = AutoBudget::new(vec![1.0, 1.0, 1.0, 1.0, 3.0, 3.0, 3.0, 3.0]).unwrap();
        stepped.select(&t, &mut keep);
        assert!(keep[first] && keep[second]);
        assert_eq!(stepped.last().kept, 3);
        assert_eq!(keep.iter().filter(|&&k| k).count(), 4);
        // Paused, the floor is not drafted; what costs no more than an undrafted step is
        // (here up to 4 tokens), in rank order.
        stepped.backoff.pause_left = 2;
        stepped.select(&t, &mut keep);
        assert_eq!(stepped.last().kept, 3);
        assert!(stepped.free_step);
        dear.backoff.pause_left = 2;
        dear.select(&t, &mut keep);
        assert_eq!(dear.last().kept, 0);
        assert!(!dear.free_step);
    }

    /// One step as a session runs it on `chain`'s tree: select, verify the cut tree, learn.
    /// `accept`: the chain wherever it was kept is accepted (its sibling, token 99, is the
    /// other guess at depth 1 and cannot be accepted with it); else only the root. Returns
    /// the nodes kept.
    fn verified_step(
        b: &mut AutoBudget,
        t: &DraftTree,
        keep: &mut Vec<bool>,
        accept: bool,
    ) -> usize {
        b.select(t, keep);
        let mut cut = t.clone();
        cut.retain(keep);
        let on: Vec<usize> = if accept {
            (0..cut.len()).filter(|&i| cut.tokens[i] != 99).collect()
        } else {
            vec![0]
        };
        b.learn(&cut, &on);
        b.last().kept
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
    fn a_pause_neither_explores_nor_spends_the_credit_and_its_overrides_are_judged() {
        // Outside a pause, the saved credit buys an exploration of these.
        let t = unlikely_chain(40);
        let cost: Vec<f32> = (1..=64).map(|n| 1.0 + 0.01 * n as f32).collect();
        let mut b = AutoBudget::new(cost).unwrap();
        b.credit = 10.0;
        let mut keep = Vec::new();
        b.backoff.pause_left = 3;
        b.select(&t, &mut keep);
        assert_eq!(b.last().kept, 0);
        assert_eq!((b.credit, b.explored, b.backoff.explored), (10.0, 0, false));
        b.backoff.pause_left = 0;
        b.select(&t, &mut keep);
        assert!(b.last().kept >= 8 && b.backoff.explored && b.credit < 10.0);
        // A long copy that has held drafts during a pause (the override), and that step is
        // judged like any drafted one: its failure counts toward the next pause.
        let copy = copy_chain(20);
        for _ in 0..30 {
            b.learn(&copy, &(0..=20).collect::<Vec<_>>());
        }
        b.begin_request();
        b.credit = 10.0;
        b.backoff.pause_left = 3;
        b.select(&copy, &mut keep);
        assert!(b.last().kept >= 10 && !b.backoff.explored, "{:?}", b.last());
        let mut cut = copy.clone();
        cut.retain(&keep);
        b.learn(&cut, &[0]);
        assert_eq!(b.backoff.judged, 1);
    }

    #[test]
    fn exploring_costs_at_most_its_share_of_the_time() {
        // The best choice is always none, so every kept node explores.
        let t = unlikely_chain(40);
        let cost: Vec<f32> = (1..=64).map(|n| 1.0 + 0.1 * n as f32).collect();
        let mut b = AutoBudget::new(cost.clone()).unwrap();
        let mut keep = Vec::new();
        let (steps, mut spent, mut explored) = (2000, 0.0f32, 0);
        for _ in 0..steps {
            b.select(&t, &mut keep);
            let kept = b.last().kept;
            spent += cost[kept] - cost[0];
            explored += (kept > 0) as usize;
        }
        assert!(explored >= 10, "{explored} explorations");
        let budget = EXPLORE_SHARE * steps as f32 * cost[0];
        assert!(
            spent <= budget + EXPLORE_CREDIT_CAP * cost[0],
            "{spent} > {budget}"
        );
        // Where every extra node costs a whole pass, the largest sizes are never affordable
        // and are skipped, not waited for.
        let mut steep = AutoBudget::new((1..=64).map(|n| n as f32).collect()).unwrap();
        let mut sizes = std::collections::BTreeSet::new();
        for _ in 0..steps {
            steep.select(&t, &mut keep);
            sizes.insert(steep.last().kept);
        }
        assert_eq!(sizes.into_iter().collect::<Vec<_>>(), vec![0]);
    }

    #[test]
    fn chain_buckets_follow_depth_and_match_length() {
        let mut t = DraftTree::default();
        t.reset(1, [NO_TOKEN, NO_TOKEN]);
        let mut v = 0;
        for d in 1..=64u32 {
            v = t.push(v, 10 + d, 40.0, NodeSource::Suffix); // after a 40-token match
        }
        t.push(0, 7, 3.0, NodeSource::Suffix); // after a 3-token match
        t.into_preorder();
        let b: Vec<usize> = (1..t.len()).map(|i| AutoBudget::bucket(&t, i)).collect();
        assert!(b.iter().all(|&x| (SCORE_BUCKETS..BUCKETS).contains(&x)));
        let long: Vec<usize> = b[..64].to_vec();
        assert!(long.windows(2).all(|w| w[0] <= w[1])); // deeper, never an earlier bucket
        let distinct: std::collections::BTreeSet<_> = long.iter().collect();
        assert_eq!(distinct.len(), CHAIN_DEPTHS); // 16 single depths, then six of 8
        assert_ne!(b[64], long[0]); // same depth, shorter match: its own bucket
        let fresh = AutoBudget::new(vec![1.0; 80]).unwrap();
        assert!(fresh.prior(b[64]) < fresh.prior(long[0])); // a shorter match holds less
        let mut ranked = fresh.clone();
        ranked.rank(&t);
        let probs: Vec<f32> = (1..=64).map(|i| ranked.mean[i]).collect();
        assert!(probs.windows(2).all(|w| w[0] > w[1])); // each token: its parent's times the hold
    }

    #[test]
    fn backs_off_to_no_drafts_when_nothing_is_accepted_and_comes_back() {
        // A CPU-like curve: each node costs 5% of a pass.
        let cost: Vec<f32> = (1..=64).map(|n| 1.0 + 0.05 * (n - 1) as f32).collect();
        let t = chain(8);
        let mut b = AutoBudget::new(cost).unwrap();
        b.scale.turn_off(); // the backoff alone (the request's correction would price the source down first)
        let mut keep = Vec::new();
        b.select(&t, &mut keep);
        assert!(b.last().kept > 0); // the path scores (0.9^d) promise acceptance
        let mut step = |b: &mut AutoBudget, accept: bool| verified_step(b, &t, &mut keep, accept);
        let kept: Vec<usize> = (0..40).map(|_| step(&mut b, false)).collect(); // nothing accepted
        let first_zero = kept.iter().position(|&k| k == 0).unwrap();
        assert!(
            first_zero <= BACKOFF_AFTER as usize,
            "backed off only after {first_zero} steps: {kept:?}"
        );
        // Each try that fails pauses twice as long: most of the later steps draft nothing.
        let drafted_late = kept[10..].iter().filter(|&&k| k > 0).count();
        assert!(drafted_late <= 10, "{kept:?}");
        assert!(b.pauses() >= 3, "{kept:?}");
        // During a pause, a long copy whose chain has held drafts anyway.
        let mut paused = b.clone();
        paused.backoff.pause_left = 10;
        let copy = copy_chain(20);
        for _ in 0..30 {
            paused.learn(&copy, &(0..=20).collect::<Vec<_>>());
        }
        paused.backoff.pause_left = 10;
        let mut keep_copy = Vec::new();
        paused.select(&copy, &mut keep_copy);
        assert!(paused.last().kept >= 10, "{:?}", paused.last());
        assert_eq!(paused.backoff.pause_left, 9); // the pause runs on for marginal steps
                                                  // A new request starts without a pause (its calibration carries over).
        let mut next = b.clone();
        next.begin_request();
        assert_eq!(next.pauses(), 0);
        assert_eq!(next.backoff, Backoff::default());
        // Acceptance returns (the chain holds whenever verified): exploring finds it again.
        let kept: Vec<usize> = (0..300).map(|_| step(&mut b, true)).collect();
        let back = kept.iter().position(|&k| k >= 6);
        assert!(back.is_some(), "never drafted again: {kept:?}");
        assert!(kept[kept.len() - 10..].iter().all(|&k| k >= 6), "{kept:?}");
    }

    #[test]
    fn siblings_share_their_parents_probability_and_a_holding_chain_keeps_its_own() {
        let mut b = AutoBudget::new(vec![1.0; 64]).unwrap();
        let copy = copy_chain(12);
        for _ in 0..30 {
            b.learn(&copy, &(0..=12).collect::<Vec<_>>()); // the chain held every time
        }
        b.rank(&copy);
        let alone: Vec<f32> = b.mean.clone();
        // The same chain with four search guesses beside its first token, each of a path
        // score whose bucket alone would promise about as much as the chain.
        let mut t = DraftTree::default();
        t.reset(1, [NO_TOKEN, NO_TOKEN]);
        let mut v = 0;
        for d in 1..=12 {
            v = t.push(v, 10 + d, 40.0, NodeSource::Suffix);
        }
        for g in 0..4 {
            let w = t.push(0, 100 + g, 0.9, NodeSource::Search);
            t.push(w, 200 + g, 0.85, NodeSource::Search);
        }
        t.into_preorder();
        b.rank(&t);
        let chain: Vec<usize> = (1..t.len())
            .filter(|&i| t.sources[i] == NodeSource::Suffix)
            .collect();
        for (k, &i) in chain.iter().enumerate() {
            assert!(
                (b.mean[i] - alone[k + 1]).abs() < 1e-6,
                "chain node {k}: {} vs {}",
                b.mean[i],
                alone[k + 1]
            );
        }
        // Every node's children together are priced at most at the node itself.
        for p in 0..t.len() {
            let kids: f32 = (1..t.len())
                .filter(|&c| t.parents[c] == p as i32)
                .map(|c| b.mean[c])
                .sum();
            assert!(
                kids <= b.mean[p] + 1e-6,
                "node {p}: children {kids} > {}",
                b.mean[p]
            );
        }
        let guesses: f32 = (1..t.len())
            .filter(|&i| t.depths[i] == 1 && t.sources[i] == NodeSource::Search)
            .map(|i| b.mean[i])
            .sum();
        assert!(guesses <= 1.0 - alone[1] + 1e-6, "{guesses}");
    }

    #[test]
    fn a_try_after_a_pause_is_judged_in_fewer_steps_than_the_first() {
        let cost: Vec<f32> = (1..=64).map(|n| 1.0 + 0.05 * (n - 1) as f32).collect();
        let t = chain(8);
        let mut b = AutoBudget::new(cost).unwrap();
        b.scale.turn_off(); // the backoff alone
        let mut keep = Vec::new();
        let mut drafted = Vec::new(); // per step: did it draft (and was it judged)?
        for _ in 0..80 {
            let kept = verified_step(&mut b, &t, &mut keep, false); // nothing accepted
            drafted.push(kept > 0 && !b.backoff.explored);
        }
        // Runs of judged drafting steps: the first judgement takes BACKOFF_AFTER, each try
        // after a pause BACKOFF_RETRY.
        let runs: Vec<usize> = drafted
            .split(|&d| !d)
            .map(|r| r.len())
            .filter(|&n| n > 0)
            .collect();
        assert_eq!(runs[0], BACKOFF_AFTER as usize, "{drafted:?}");
        assert!(runs.len() >= 3, "{drafted:?}");
        assert!(
            runs[1..].iter().all(|&n| n == BACKOFF_RETRY as usize),
            "{runs:?}"
        );
    }

    #[test]
    fn a_long_copy_is_verified_past_the_depths_observed_so_far() {
        // A CPU-like curve: each node costs 3% of a pass.
        let cost: Vec<f32> = (1..=80).map(|n| 1.0 + 0.03 * (n - 1) as f32).collect();
        let mut b = AutoBudget::new(cost).unwrap();
        let short = copy_chain(16);
        for _ in 0..30 {
            b.learn(&short, &(0..=16).collect::<Vec<_>>()); // every copied token held
        }
        let long = copy_chain(64);
        let mut keep = Vec::new();
        b.select(&long, &mut keep);
        let held = b.last();
        assert!(held.kept > 40, "{held:?}"); // depths never seen, priced by the first 16
                                             // Chains that now break at once: the first hold rate falls, and every deeper token
                                             // (its parent's probability times its own rate) with it.
        for _ in 0..60 {
            b.learn(&short, &[0]);
        }
        b.begin_request(); // judged by its price, not held back by a pause
        b.select(&long, &mut keep);
        assert!(
            b.last().expected < 0.5 * held.expected,
            "{:?} after {held:?}",
            b.last()
        );
    }

    #[test]
    fn a_pause_drafts_what_costs_no_more_than_an_undrafted_step_while_its_times_agree() {
        let mut t = DraftTree::default(); // two guesses, neither a holding copy
        t.reset(1, [NO_TOKEN, NO_TOKEN]);
        t.push(0, 5, 0.4, NodeSource::Search);
        t.push(1, 6, 0.16, NodeSource::Search);
        t.into_preorder();
        // The curve: 2 tokens cost what 1 does, 3 or more dearer.
        let cost: Vec<f32> = (1..=64).map(|n| if n <= 2 { 1.0 } else { 1.5 }).collect();
        let mut b = AutoBudget::new(cost).unwrap();
        let mut keep = Vec::new();
        b.observe_step(1, 1.0); // an undrafted step measured
        b.backoff.pause_left = 10;
        b.select(&t, &mut keep);
        assert_eq!((b.last().kept, b.free_step), (1, true));
        b.observe_step(2, 1.01); // it cost what the curve said
        b.select(&t, &mut keep);
        assert_eq!(b.last().kept, 1);
        b.observe_step(2, 3.0); // dearer than an undrafted step: the pause drafts nothing
        b.observe_step(1, 1.0);
        b.select(&t, &mut keep);
        assert_eq!((b.last().kept, b.free_step), (0, false));
    }

    #[test]
    fn a_source_that_fails_in_this_request_is_priced_down_and_the_others_keep_drafting() {
        // A search guess and a copy after a 40-token match, below the root.
        let mut t = DraftTree::default();
        t.reset(1, [NO_TOKEN, NO_TOKEN]);
        t.push(0, 5, 0.5, NodeSource::Search);
        let mut v = 0;
        for d in 0..8 {
            v = t.push(v, 20 + d, 40.0, NodeSource::Suffix);
        }
        t.into_preorder();
        let chain_kept = |cut: &DraftTree| cut.tokens.iter().filter(|&&x| x >= 20).count();
        let cost: Vec<f32> = (1..=64).map(|n| 1.0 + 0.05 * (n - 1) as f32).collect();
        // Earlier requests copied: such chains held every time.
        let run = |scaled: bool| {
            let mut b = AutoBudget::new(cost.clone()).unwrap();
            if !scaled {
                b.scale.turn_off();
            }
            let mut copy = t.clone();
            let only: Vec<bool> = t.tokens.iter().map(|&x| x != 5).collect();
            copy.retain(&only);
            for _ in 0..30 {
                b.learn(&copy, &(0..copy.len()).collect::<Vec<_>>());
            }
            b.begin_request();
            let mut keep = Vec::new();
            // This request: the copy never holds, the search guess always does (the first
            // steps, which verify only the copy, gain nothing: the backoff pauses).
            let mut kept = Vec::new();
            for _ in 0..16 {
                b.select(&t, &mut keep);
                let mut cut = t.clone();
                cut.retain(&keep);
                let on: Vec<usize> = (0..cut.len())
                    .filter(|&i| i == 0 || cut.tokens[i] == 5)
                    .collect();
                b.learn(&cut, &on);
                kept.push((chain_kept(&cut), cut.tokens.contains(&5)));
            }
            kept
        };
        let (scaled, table) = (run(true), run(false));
        assert!(scaled[0].0 >= 4 && table[0].0 >= 4, "{scaled:?} {table:?}");
        // Within a few steps the copy is left out (but for an exploring step now and then)
        // and the search guess is verified at every step.
        let later = &scaled[4..];
        assert!(later.iter().all(|k| k.1), "{scaled:?}");
        assert!(later.iter().filter(|k| k.0 > 0).count() <= 2, "{scaled:?}");
        // The table alone still prices the copy at what earlier requests made of it: the
        // search guess gets fewer steps.
        let guessed = |k: &[(usize, bool)]| k.iter().filter(|k| k.1).count();
        assert!(guessed(&table) < guessed(&scaled) - 4, "{table:?}");
    }

    #[test]
    fn short_copies_the_memory_also_proposed_are_priced_apart() {
        // Two chains after 3-token matches: one whose first token the search proposed too.
        let mut t = DraftTree::default();
        t.reset(1, [NO_TOKEN, NO_TOKEN]);
        t.push(0, 5, 0.5, NodeSource::Search);
        let none = crate::token_set::TokenSet::from_ids(64, &[]);
        t.graft_chain(&[5, 6], 3.0, &none, 8, NodeSource::Suffix);
        t.push(0, 7, 3.0, NodeSource::Suffix);
        t.into_preorder();
        let at = |tok: u32| t.tokens.iter().position(|&x| x == tok).unwrap();
        let (agreed, alone) = (AutoBudget::bucket(&t, at(5)), AutoBudget::bucket(&t, at(7)));
        assert_ne!(agreed, alone);
        assert!(AutoBudget::is_chain(agreed) && AutoBudget::is_chain(alone));
        assert_eq!(
            AutoBudget::match_bucket(agreed),
            AutoBudget::match_bucket(alone)
        );
        // The agreed copy always holds, the lone one never: each bucket (and its kind's
        // prior for depths not yet seen) learns its own rate.
        let mut b = AutoBudget::new(vec![1.0; 8]).unwrap();
        let (p_agreed, p_alone) = (b.probability(agreed), b.probability(alone));
        for _ in 0..40 {
            b.learn(&t, &[0, at(5)]);
        }
        assert!(b.probability(agreed) > p_agreed && b.probability(alone) < p_alone);
        assert!(b.probability(agreed) > 0.9 && b.probability(alone) < 0.1);
        let deeper_alone = AutoBudget::bucket(&t, at(7)) + MATCH_BUCKETS; // depth 2, alone
        assert!(b.prior(deeper_alone) < 0.1);
        let kinds: Vec<&str> = b.calibration().iter().map(|c| c.0).collect();
        assert!(kinds.contains(&"agreed") && kinds.contains(&"chain"));
        // After a long match the copy is evidence enough: one bucket either way.
        let mut long = DraftTree::default();
        long.reset(1, [NO_TOKEN, NO_TOKEN]);
        long.push(0, 5, 0.5, NodeSource::Search);
        long.graft_chain(&[5], 40.0, &none, 8, NodeSource::Suffix);
        long.push(0, 7, 40.0, NodeSource::Suffix);
        assert_eq!(long.sources[1], NodeSource::Agreed);
        assert_eq!(AutoBudget::bucket(&long, 1), AutoBudget::bucket(&long, 2));
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

    #[test]
    fn frequency_nodes_start_at_their_probability_and_learn_apart_from_agreed_ones() {
        let mut t = DraftTree::default();
        t.reset(1, [NO_TOKEN, NO_TOKEN]);
        t.push(0, 5, frequent_score(0.9, 4), NodeSource::Frequent);
        t.push(0, 6, frequent_score(0.9, 4), NodeSource::FrequentAgreed);
        let mut b = AutoBudget::new(vec![1.0; 8]).unwrap();
        let (alone, agreed) = (AutoBudget::bucket(&t, 1), AutoBudget::bucket(&t, 2));
        assert_ne!(alone, agreed);
        assert!(!AutoBudget::is_chain(alone) && !AutoBudget::is_chain(agreed));
        assert!((b.prior(alone) - 0.9).abs() < 0.1, "{}", b.prior(alone));
        let mut short = t.clone();
        short.scores[1] = frequent_score(0.9, 1);
        assert_ne!(AutoBudget::bucket(&short, 1), alone); // another match class: its own bucket
        for _ in 0..50 {
            b.learn(&t, &[0, 2]); // the agreed one always holds, the lone one never
        }
        assert!(b.probability(alone) < 0.1);
        assert!(b.probability(agreed) > 0.9);
        let kinds: Vec<&str> = b.calibration().iter().map(|c| c.0).collect();
        assert!(kinds.contains(&"frequent") && kinds.contains(&"frequent_agreed"));
    }

    /// `verified_step` with its time reported: a drafted step of `n` nodes takes
    /// `drafted_s(n)`, an undrafted one `plain_s`.
    fn timed_step(
        b: &mut AutoBudget,
        t: &DraftTree,
        keep: &mut Vec<bool>,
        accept: bool,
        plain_s: f64,
        drafted_s: impl Fn(usize) -> f64,
    ) -> usize {
        let kept = verified_step(b, t, keep, accept);
        let s = if kept == 0 {
            plain_s
        } else {
            drafted_s(kept + 1)
        };
        b.observe_step(kept + 1, s);
        kept
    }

    #[test]
    fn the_backoff_judges_by_measured_times_not_by_the_curve() {
        // The curve says a node costs nothing, so every drafted step looks like a gain; the
        // real passes cost three undrafted steps and accept one node: drafting loses.
        let t = chain(8);
        let mut b = AutoBudget::new(vec![1.0; 64]).unwrap();
        let mut keep = Vec::new();
        let mut kept = Vec::new();
        for _ in 0..40 {
            let k = timed_step(&mut b, &t, &mut keep, false, 1.0, |_| 3.0);
            kept.push(k);
        }
        assert!(b.plain_s().is_some_and(|p| (p - 1.0).abs() < 1e-6));
        assert!(b.pauses() >= 1, "never paused: {kept:?}");
        let drafted = kept[10..].iter().filter(|&&k| k > 0).count();
        assert!(drafted <= 12, "{kept:?}");

        // The curve says a node costs a whole pass (a point kept from a loaded machine);
        // the real passes cost what an undrafted step does and the chain holds: no pause.
        let steep: Vec<f32> = (1..=64).map(|n| n as f32).collect();
        let mut b = AutoBudget::new(steep).unwrap();
        let copy = copy_chain(20);
        for _ in 0..30 {
            b.learn(&copy, &(0..=20).collect::<Vec<_>>());
        }
        b.begin_request();
        let mut paused = 0;
        for _ in 0..40 {
            b.select(&copy, &mut keep);
            let k = b.last().kept;
            let mut cut = copy.clone();
            cut.retain(&keep);
            b.learn(&cut, &(0..=k).collect::<Vec<_>>());
            b.observe_step(k + 1, 1.0);
            paused += (b.backoff.pause_left > 0) as usize;
        }
        assert_eq!((paused, b.pauses()), (0, 0));
    }

    #[test]
    fn an_undrafted_step_is_timed_once_timings_arrive_and_again_when_stale() {
        let t = chain(8);
        let mut b = AutoBudget::new(vec![1.0; 64]).unwrap();
        let mut keep = Vec::new();
        let first = timed_step(&mut b, &t, &mut keep, true, 1.0, |_| 1.1);
        assert!(first > 0); // nothing timed yet: the first step drafts
        assert_eq!(timed_step(&mut b, &t, &mut keep, true, 1.0, |_| 1.1), 0); // the probe
        assert_eq!(b.plain_age, 0);
        for _ in 0..PLAIN_STALE + 8 {
            assert!(timed_step(&mut b, &t, &mut keep, true, 1.0, |_| 1.1) > 0);
        }
        // Stale, but the tree holds: it drafts on rather than pay a step to re-time.
        assert!(b.plain_age > PLAIN_STALE && !b.plain_needed(true) && b.plain_needed(false));
    }
}
