//! One request stream: the committed history, a drafter, and the shared accept step.
//!
//! begin -> (seed) -> loop { propose -> [verify outside] -> observe }.

use crate::accept::{accept_path, Acceptance};
use crate::budget::AutoBudget;
use crate::cost::CostCurve;
use crate::drafter::{Drafter, TopKRows};
use crate::error::{check_tokens, Error, Result};
use crate::recap::{check_vocab, SharedMemory};
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
        })
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

    /// Replaces the drafter's persistent memory (between requests only).
    pub fn set_memory(&mut self, memory: SharedMemory) -> Result<()> {
        if self.awaiting_verification {
            return Err(Error::InvalidState(
                "set_memory: expected no tree awaiting verification (call it between requests)"
                    .into(),
            ));
        }
        self.drafter.set_memory(memory)
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
    /// before took `host_s`. Ignored without a cost curve.
    pub fn observe_timing(
        &mut self,
        tokens: usize,
        forward_s: f64,
        host_s: Option<f64>,
    ) -> Result<()> {
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
        self.history.clear();
        self.history.extend_from_slice(context);
        self.awaiting_verification = false;
        self.drafter.begin_request(context);
        Ok(())
    }

    /// Seeds memories from prefill rows: row i belongs to history[i].
    pub fn seed(&mut self, rows: &TopKRows<'_>) -> Result<()> {
        if self.history.is_empty() {
            return Err(Error::InvalidState("seed called before begin".into()));
        }
        if rows.rows() > self.history.len() {
            return Err(Error::ShapeMismatch {
                name: "seed rows",
                expected: format!(
                    "at most {} rows (one per context token)",
                    self.history.len()
                ),
                got: format!("{} rows", rows.rows()),
            });
        }
        self.drafter.seed(&self.history, rows);
        Ok(())
    }

    pub fn propose(&mut self) -> Result<&DraftTree> {
        if self.history.is_empty() {
            return Err(Error::InvalidState("propose called before begin".into()));
        }
        self.drafter.propose(&self.history, &mut self.tree);
        if let Some(b) = &mut self.auto_budget {
            b.select(&self.tree, &mut self.keep);
            self.tree.retain(&self.keep);
        }
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
        self.awaiting_verification = false;
        Ok(acc)
    }
}
