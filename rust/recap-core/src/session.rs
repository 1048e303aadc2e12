//! One request: the committed history, the request's drafter state, its view of the
//! budget controller, and the one accept step every drafter shares.
//!
//! begin -> (seed) -> loop { propose -> [verify outside] -> observe } -> finish.
//! Sessions are opened by a shared `engine::SharedDrafter`; `finish` (or dropping the
//! session) hands what outlives the request back to it.

use crate::accept::{accept_path, Acceptance};
use crate::budget::AutoBudget;
use crate::calibration::Calibration;
use crate::cost::CostCurve;
use crate::drafter::{Drafter, TopKRows};
use crate::error::{check_tokens, Error, Result};
use crate::shared_memory::check_vocab;
use crate::tree::DraftTree;

pub struct DraftSession {
    drafter: Box<dyn Drafter>,
    vocab_size: usize,
    history: Vec<u32>,
    tree: DraftTree,
    awaiting_verification: bool,
    accept_scratch: Vec<bool>,
    /// When set, each drafted tree is cut to the prefix the hardware pays for.
    auto_budget: Option<AutoBudget>,
    /// The cost curve the automatic budget sizes trees with, kept online from step timings.
    cost: Option<CostCurve>,
    keep: Vec<bool>,
    /// Where the budget's learned state goes when the request ends (and came from).
    home: Option<Calibration>,
    /// A request has begun and not yet been handed back.
    open: bool,
    /// `propose_ranked` drafted a tree that `cut_ranked` has not cut yet.
    ranked: bool,
    /// Tokens the request may still commit (`limit_new_tokens`); None: no limit known.
    left: Option<usize>,
}

/// Steps between refreshes of the curve the automatic budget reads.
const COST_REFRESH_EVERY: u64 = 16;

impl DraftSession {
    pub fn new(drafter: Box<dyn Drafter>, vocab_size: usize) -> Result<Self> {
        check_vocab(vocab_size)?;
        Ok(DraftSession {
            drafter,
            vocab_size,
            history: Vec::new(),
            tree: DraftTree::default(),
            awaiting_verification: false,
            accept_scratch: Vec::new(),
            auto_budget: None,
            cost: None,
            keep: Vec::new(),
            home: None,
            open: false,
            ranked: false,
            left: None,
        })
    }

    /// A session that starts from `home`'s budget state and writes its own back at `finish`.
    pub fn with_calibration(
        drafter: Box<dyn Drafter>,
        vocab_size: usize,
        home: Calibration,
    ) -> Result<Self> {
        let mut s = Self::new(drafter, vocab_size)?;
        if let Some(state) = home.get() {
            s.auto_budget = state.auto;
            s.cost = state.cost;
        }
        s.home = Some(home);
        Ok(s)
    }

    /// Ends the request: the drafter hands over what outlives it, and the budget's learned
    /// state goes back to the calibration the session was opened with. Idempotent.
    pub fn finish(&mut self) {
        if self.open {
            self.drafter.end_request();
            self.open = false;
        }
        self.awaiting_verification = false;
        if let Some(home) = &self.home {
            if self.auto_budget.is_some() || self.cost.is_some() {
                home.put(self.auto_budget.clone(), self.cost.clone());
            }
        }
    }

    /// Cuts every tree to the prefix maximising expected tokens per second under `cost`
    /// (`cost[n - 1]`: a verification pass over n tokens); None verifies whole trees.
    pub fn set_auto_budget(&mut self, cost: Option<Vec<f32>>) -> Result<()> {
        self.cost = None; // a given curve replaces the online one
        self.install_budget(cost)
    }

    fn install_budget(&mut self, cost: Option<Vec<f32>>) -> Result<()> {
        match (cost, &mut self.auto_budget) {
            (None, slot) => *slot = None,
            (Some(c), Some(b)) => b.set_cost(c)?,
            (Some(c), slot) => *slot = Some(AutoBudget::new(c)?),
        }
        Ok(())
    }

    /// The automatic budget with a cost curve measured at `points` tokens (`seconds` each),
    /// corrected online by `observe_timing`.
    pub fn set_cost_points(&mut self, points: Vec<usize>, seconds: Vec<f64>) -> Result<()> {
        let curve = CostCurve::new(points, seconds)?;
        self.install_budget(Some(curve.curve(self.drafter.max_nodes() + 1)))?;
        self.cost = Some(curve);
        Ok(())
    }

    /// The step's verification pass over `tokens` took `forward_s`; the host work of the step
    /// before took `host_s`. The automatic budget's backoff judges the step by these times;
    /// the cost curve, when there is one, is corrected by them.
    pub fn observe_timing(
        &mut self,
        tokens: usize,
        forward_s: f64,
        host_s: Option<f64>,
    ) -> Result<()> {
        if let Some(b) = &mut self.auto_budget {
            let host = host_s.filter(|h| h.is_finite() && *h >= 0.0).unwrap_or(0.0);
            b.observe_step(tokens, forward_s + host);
        }
        let Some(curve) = self.cost.as_mut() else {
            return Ok(());
        };
        curve.observe(tokens, forward_s, host_s);
        if curve.observed() % COST_REFRESH_EVERY == 0 {
            let c = curve.curve(self.drafter.max_nodes() + 1);
            self.install_budget(Some(c))?;
        }
        Ok(())
    }

    pub fn cost_curve(&self) -> Option<&CostCurve> {
        self.cost.as_ref()
    }

    pub fn auto_budget(&self) -> Option<&AutoBudget> {
        self.auto_budget.as_ref()
    }

    pub fn drafter(&self) -> &dyn Drafter {
        self.drafter.as_ref()
    }
    pub fn history(&self) -> &[u32] {
        &self.history
    }
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }
    pub fn tree(&self) -> &DraftTree {
        &self.tree
    }

    /// Starts a request from its committed tokens (the last one is the first root).
    pub fn begin(&mut self, context: &[u32]) -> Result<()> {
        if context.is_empty() {
            return Err(Error::invalid(
                "context",
                "at least one token",
                "an empty sequence",
            ));
        }
        check_tokens("context", context, self.vocab_size)?;
        if self.open {
            self.drafter.end_request(); // a session reused for the next request
        }
        self.history.clear();
        self.history.extend_from_slice(context);
        self.awaiting_verification = false;
        self.ranked = false;
        self.left = None;
        if let Some(b) = &mut self.auto_budget {
            b.begin_request();
        }
        self.drafter.begin_request(context);
        self.open = true;
        Ok(())
    }

    /// Seeds memories from prefill rows: row i belongs to history[start + i].
    pub fn seed(&mut self, rows: &TopKRows<'_>, start: usize) -> Result<()> {
        if self.history.is_empty() {
            return Err(Error::InvalidState("seed called before begin".into()));
        }
        if start + rows.rows() > self.history.len() {
            return Err(Error::ShapeMismatch {
                name: "seed rows",
                expected: format!(
                    "at most {} rows from position {start} (one per context token)",
                    self.history.len().saturating_sub(start)
                ),
                got: format!("{} rows", rows.rows()),
            });
        }
        self.drafter.seed(&self.history, start, rows);
        Ok(())
    }

    /// The request may commit at most `tokens` more (its length limit; 0 or 1: no draft
    /// can add one). A path of depth d commits d + 1 tokens, so nodes deeper than
    /// `tokens - 1` are dropped before the budget sizes the tree: a long copy's last step
    /// verifies only what can still be kept. Until the next `begin`; each `observe` counts
    /// its committed tokens off.
    pub fn limit_new_tokens(&mut self, tokens: usize) {
        self.left = Some(tokens);
    }

    /// The drafter's next tree, cut to the depth the request's length limit can still use.
    fn draft(&mut self) {
        self.drafter.propose(&self.history, &mut self.tree);
        let Some(left) = self.left else { return };
        let max_depth = left.saturating_sub(1) as u32;
        if self.tree.depths.iter().all(|&d| d <= max_depth) {
            return;
        }
        self.keep.clear();
        self.keep
            .extend(self.tree.depths.iter().map(|&d| d <= max_depth));
        self.tree.retain(&self.keep);
    }

    pub fn propose(&mut self) -> Result<&DraftTree> {
        if self.history.is_empty() {
            return Err(Error::InvalidState("propose called before begin".into()));
        }
        self.ranked = false;
        self.draft();
        if let Some(b) = &mut self.auto_budget {
            b.select(&self.tree, &mut self.keep);
            self.tree.retain(&self.keep);
        }
        self.awaiting_verification = true;
        Ok(&self.tree)
    }

    /// Drafts the next tree without cutting it and ranks its nodes for a caller that sizes
    /// several requests' trees together (a batch): returns the cumulative expected accepted
    /// nodes of the ranked prefixes (`gains[m]` with m nodes kept; see `AutoBudget::rank`).
    /// `cut_ranked` then keeps a prefix. Needs the automatic budget.
    pub fn propose_ranked(&mut self) -> Result<&[f32]> {
        if self.history.is_empty() {
            return Err(Error::InvalidState(
                "propose_ranked called before begin".into(),
            ));
        }
        if self.auto_budget.is_none() {
            return Err(Error::InvalidState(
                "propose_ranked needs the automatic budget (set_cost or set_cost_points first)"
                    .into(),
            ));
        }
        self.draft();
        self.awaiting_verification = false;
        self.ranked = true;
        let tree = &self.tree;
        Ok(self.auto_budget.as_mut().map_or(&[], |b| b.rank(tree)))
    }

    /// Keeps the root and the first `nodes` ranked nodes of the tree `propose_ranked` drafted.
    pub fn cut_ranked(&mut self, nodes: usize) -> Result<&DraftTree> {
        let b = match (self.ranked, self.auto_budget.as_mut()) {
            (true, Some(b)) => b,
            _ => {
                return Err(Error::InvalidState(
                    "cut_ranked called without a ranked tree (call propose_ranked first)".into(),
                ))
            }
        };
        b.keep_ranked(nodes, self.tree.len(), &mut self.keep);
        self.tree.retain(&self.keep);
        self.ranked = false;
        self.awaiting_verification = true;
        Ok(&self.tree)
    }

    /// Accepts against the target's per-node argmax `pred`, updates the drafter from the
    /// per-node rows, and appends the committed tokens to the history.
    pub fn observe(&mut self, pred: &[u32], rows: &TopKRows<'_>) -> Result<Acceptance> {
        if !self.awaiting_verification {
            return Err(Error::InvalidState(
                "observe called without a proposed tree (call propose first)".into(),
            ));
        }
        let n = self.tree.len();
        if pred.len() != n || rows.rows() != n {
            return Err(Error::ShapeMismatch {
                name: "verification",
                expected: format!("{n} predictions and {n} top-k rows (one per tree node)"),
                got: format!("{} predictions and {} rows", pred.len(), rows.rows()),
            });
        }
        check_tokens("pred", pred, self.vocab_size)?;
        let acc = accept_path(&self.tree, pred, &mut self.accept_scratch);
        let committed = acc.committed_tokens(&self.tree);
        if let Some(b) = &mut self.auto_budget {
            b.learn(&self.tree, &acc.path);
        }
        self.drafter.observe(&self.tree, rows, &committed);
        self.history.extend_from_slice(&committed);
        if let Some(left) = &mut self.left {
            *left = left.saturating_sub(committed.len());
        }
        self.awaiting_verification = false;
        Ok(acc)
    }
}

impl Drop for DraftSession {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peers::{PromptLookup, SamDrafter, TokenRecycling, TR_LEVELS};
    use crate::token_set::TokenSet;
    use crate::{RecapConfig, RecapDrafter, SharedMemory};
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        Begin(Vec<u32>),
        Seed(usize, usize, Vec<u32>, Vec<f32>),
        Propose,
        Observe(usize, usize, Vec<u32>, Vec<f32>),
        Cost(Vec<usize>, Vec<f64>),
        Timing(usize, f64, Option<f64>),
        Limit(usize),
        Finish,
    }

    fn op() -> impl Strategy<Value = Op> {
        let ids = proptest::collection::vec(0u32..80, 0..40);
        let probs = proptest::collection::vec(
            prop_oneof![
                0.0f32..1.0,
                Just(f32::NAN),
                Just(f32::INFINITY),
                Just(-1.0f32)
            ],
            0..40,
        );
        prop_oneof![
            ids.clone().prop_map(Op::Begin),
            (0usize..10, 0usize..6, ids.clone(), probs.clone())
                .prop_map(|(r, k, i, p)| Op::Seed(r, k, i, p)),
            Just(Op::Propose),
            Just(Op::Propose),
            (0usize..10, 0usize..6, ids, probs).prop_map(|(r, k, i, p)| Op::Observe(r, k, i, p)),
            (
                proptest::collection::vec(0usize..140, 0..5),
                proptest::collection::vec(-1.0f64..1.0, 0..5)
            )
                .prop_map(|(p, s)| Op::Cost(p, s)),
            (
                0usize..200,
                -1.0f64..1.0,
                proptest::option::of(-1.0f64..1.0)
            )
                .prop_map(|(n, f, h)| Op::Timing(n, f, h)),
            (0usize..6).prop_map(Op::Limit),
            Just(Op::Finish),
        ]
    }

    fn drafter(kind: usize, vocab: usize) -> Box<dyn Drafter> {
        let memory = SharedMemory::new(vocab, 4, 64).unwrap();
        match kind {
            kind @ (0 | 4) => {
                let config = RecapConfig {
                    k: 4,
                    suffix_len: 64,
                    suffix_adaptive: true,
                    frequency: kind == 4,
                    ..RecapConfig::default()
                };
                Box::new(RecapDrafter::new(config, memory, &[]).unwrap())
            }
            1 => Box::new(TokenRecycling::new(memory, &TR_LEVELS, TokenSet::new(vocab)).unwrap()),
            2 => Box::new(SamDrafter::new(60, TokenSet::new(vocab), None).unwrap()),
            _ => Box::new(PromptLookup::new(2, 10, TokenSet::new(vocab)).unwrap()),
        }
    }

    /// Rows sized to the request: in-range ids where the op's own would not fit.
    fn rows<'a>(r: usize, k: usize, ids: &'a mut Vec<u32>, probs: &'a mut Vec<f32>) {
        ids.resize(r * k, 0);
        probs.resize(r * k, 0.5);
    }

    /// Verifies the proposed tree as a target that agrees with every node (k = 1 rows);
    /// returns the committed tokens.
    fn accept_all(s: &mut DraftSession) -> Vec<u32> {
        let tree = s.tree();
        let n = tree.len();
        // Each node's prediction is its first child's token (the chain goes on), else 0.
        let mut pred = vec![0u32; n];
        for i in (1..n).rev() {
            pred[tree.parents[i] as usize] = tree.tokens[i];
        }
        let probs = vec![1.0f32; n];
        let rows = TopKRows::new(&pred, &probs, 1, n, s.vocab_size()).unwrap();
        s.observe(&pred, &rows).unwrap().committed_tokens(s.tree())
    }

    #[test]
    fn a_length_limit_cuts_drafts_to_what_can_still_be_committed() {
        let vocab = 16;
        let prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2];
        let mut s = DraftSession::new(drafter(3, vocab), vocab).unwrap();
        s.begin(&prompt).unwrap();
        let unlimited = s.propose().unwrap().len();
        assert!(unlimited > 5, "prompt lookup drafts the repeated stretch");

        s.begin(&prompt).unwrap();
        s.limit_new_tokens(4); // a path of depth 3 commits 4 tokens
        let tree = s.propose().unwrap();
        assert_eq!(tree.depths.iter().max(), Some(&3));
        assert_eq!(tree.len(), 4);
        // Three drafts accepted and the target's own next token: the 4 tokens left.
        assert_eq!(accept_all(&mut s), vec![3, 4, 5, 0]);
        // Nothing left to commit: the next step drafts nothing.
        assert_eq!(s.propose().unwrap().len(), 1);

        s.begin(&prompt).unwrap(); // a new request has no limit until one is given
        assert_eq!(s.propose().unwrap().len(), unlimited);
    }

    #[test]
    fn the_limit_holds_for_ranked_trees_too() {
        let vocab = 16;
        let prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2];
        let mut s = DraftSession::new(drafter(3, vocab), vocab).unwrap();
        s.set_cost_points(vec![1, 64], vec![0.01, 0.011]).unwrap();
        s.begin(&prompt).unwrap();
        s.limit_new_tokens(3);
        let gains = s.propose_ranked().unwrap().len();
        assert_eq!(gains, 3, "the root and two nodes to rank");
        let tree = s.cut_ranked(10).unwrap();
        assert_eq!(tree.tokens, vec![2, 3, 4]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// Any call sequence either works or returns an error: no panic, and the history only
        /// ever holds in-vocabulary tokens.
        #[test]
        fn random_call_sequences_never_panic(kind in 0usize..5, ops in proptest::collection::vec(op(), 1..30)) {
            let vocab = 80;
            let mut s = DraftSession::new(drafter(kind, vocab), vocab).unwrap();
            let mut tree_len = 0;
            for op in ops {
                match op {
                    Op::Begin(t) => { let _ = s.begin(&t); }
                    Op::Seed(r, k, mut i, mut p) => {
                        rows(r, k, &mut i, &mut p);
                        if let Ok(rows) = TopKRows::new(&i, &p, k, r, vocab) { let _ = s.seed(&rows, 0); }
                    }
                    Op::Propose => { if let Ok(t) = s.propose() { tree_len = t.len(); } }
                    Op::Observe(r, k, mut i, mut p) => {
                        let r = if r % 2 == 0 { tree_len } else { r };
                        rows(r, k, &mut i, &mut p);
                        let pred = i.iter().step_by(k.max(1)).copied().collect::<Vec<_>>();
                        if let Ok(rows) = TopKRows::new(&i, &p, k, r, vocab) { let _ = s.observe(&pred, &rows); }
                    }
                    Op::Cost(p, sec) => { let _ = s.set_cost_points(p, sec); }
                    Op::Timing(n, f, h) => { let _ = s.observe_timing(n, f, h); }
                    Op::Limit(n) => s.limit_new_tokens(n),
                    Op::Finish => s.finish(),
                }
                prop_assert!(s.history().iter().all(|&t| (t as usize) < vocab));
            }
        }
    }
}
