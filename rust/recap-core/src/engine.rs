//! One drafter for every request: what is fixed for a drafter's lifetime (its kind and
//! configuration, the excluded tokens), what it shares across requests (a persistent memory
//! behind `Arc`, the cross-request suffix history, the budget calibration), and the
//! per-request `DraftSession`s it opens. `SharedDrafter` is `Send + Sync`: any number of
//! threads open sessions on one drafter at once; each session owns its history, C/G,
//! automaton, tree and scratch, and touches shared state only through those handles.

use crate::budget::AutoBudget;
use crate::calibration::Calibration;
use crate::cost::CostCurve;
use crate::drafter::Drafter;
use crate::error::{check_tokens, Error, Result};
use crate::peers::{
    Autoregressive, PromptLookup, SamDrafter, SuffixHistory, SuffixTreeConfig, SuffixTreeDrafter,
    TokenRecycling,
};
use crate::recap::{RecapConfig, RecapDrafter};
use crate::session::DraftSession;
use crate::shared_memory::{check_k, check_vocab, SharedMemory};
use crate::token_set::TokenSet;

/// What a drafter drafts from.
#[derive(Clone, Debug, PartialEq)]
pub enum DraftSource {
    /// No draft: plain one-token decoding through the same loop.
    Ar,
    Pld {
        max_ngram: usize,
        num_tokens: usize,
    },
    Recap(RecapConfig),
    /// Token Recycling's static template, `levels` nodes per level, rows of width `k`.
    Tr {
        levels: Vec<usize>,
        k: usize,
    },
    /// SAM-Decoding; with `fallback` (levels, k, threshold) SAM[TR].
    Sam {
        max_len: usize,
        fallback: Option<(Vec<usize>, usize, usize)>,
    },
    Suffix(SuffixTreeConfig),
}

impl DraftSource {
    /// Row width of the persistent memory this source drafts from, if it has one.
    pub fn memory_k(&self) -> Option<usize> {
        match self {
            DraftSource::Recap(c) => Some(c.k),
            DraftSource::Tr { k, .. } => Some(*k),
            DraftSource::Sam {
                fallback: Some((_, k, _)),
                ..
            } => Some(*k),
            _ => None,
        }
    }
}

pub struct SharedDrafter {
    source: DraftSource,
    vocab_size: usize,
    excluded: Vec<u32>,
    excluded_set: TokenSet,
    /// Sessions opened without a memory of their own draw on this one.
    memory: Option<SharedMemory>,
    history: SuffixHistory,
    calibration: Calibration,
    max_nodes: usize,
    name: &'static str,
}

impl SharedDrafter {
    /// Checks the configuration (by opening one session) and keeps what sessions share.
    /// `memory` is the default persistent memory (a private one is made when it is None
    /// and the source has one).
    pub fn new(
        source: DraftSource,
        vocab_size: usize,
        excluded: &[u32],
        memory: Option<SharedMemory>,
    ) -> Result<Self> {
        check_vocab(vocab_size)?;
        check_tokens("excluded", excluded, vocab_size)?;
        let memory = match (source.memory_k(), memory) {
            (None, Some(_)) => return Err(no_memory(&source)),
            (None, None) => None,
            (Some(k), Some(m)) => {
                m.check_fits(vocab_size, k)?;
                Some(m)
            }
            (Some(k), None) => {
                check_k(k)?;
                Some(SharedMemory::new(
                    vocab_size,
                    k,
                    SharedMemory::DEFAULT_CAPACITY,
                )?)
            }
        };
        let mut d = SharedDrafter {
            source,
            vocab_size,
            excluded: excluded.to_vec(),
            excluded_set: TokenSet::from_ids(vocab_size, excluded),
            memory,
            history: SuffixHistory::new(),
            calibration: Calibration::default(),
            max_nodes: 0,
            name: "",
        };
        let probe = d.build(d.memory.clone())?;
        d.max_nodes = probe.max_nodes();
        d.name = probe.name();
        Ok(d)
    }

    pub fn source(&self) -> &DraftSource {
        &self.source
    }
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }
    pub fn name(&self) -> &'static str {
        self.name
    }
    /// The most nodes one tree can hold, root not counted.
    pub fn max_nodes(&self) -> usize {
        self.max_nodes
    }
    pub fn memory(&self) -> Option<&SharedMemory> {
        self.memory.as_ref()
    }
    pub fn calibration(&self) -> &Calibration {
        &self.calibration
    }
    pub fn history_bytes(&self) -> usize {
        self.history.bytes()
    }

    /// Opens a request: `memory` (a scope's) replaces the drafter's own for this session
    /// only; `calibration` (a scope's) replaces the drafter's budget calibration.
    pub fn session(
        &self,
        memory: Option<SharedMemory>,
        calibration: Option<Calibration>,
    ) -> Result<DraftSession> {
        let memory = match (memory, self.source.memory_k()) {
            (Some(_), None) => return Err(no_memory(&self.source)),
            (Some(m), Some(k)) => {
                m.check_fits(self.vocab_size, k)?;
                Some(m)
            }
            (None, _) => self.memory.clone(),
        };
        let home = calibration.unwrap_or_else(|| self.calibration.clone());
        if !home.is_set() {
            if let Some(state) = self.calibration.get() {
                home.put(state.auto, state.cost); // a new scope starts from the drafter's state
            }
        }
        DraftSession::with_calibration(self.build(memory)?, self.vocab_size, home)
    }

    /// The automatic budget for every session opened from now on: a cost curve measured at
    /// `points` tree tokens (`seconds` each), corrected online by each session's timings.
    pub fn set_cost_points(&self, points: Vec<usize>, seconds: Vec<f64>) -> Result<()> {
        let curve = CostCurve::new(points, seconds)?;
        let auto = AutoBudget::new(curve.curve(self.max_nodes + 1))?;
        self.calibration.put(Some(auto), Some(curve));
        Ok(())
    }

    /// A fixed cost curve (`cost[n - 1]`: a pass over n tokens) for later sessions; None
    /// turns the automatic budget off.
    pub fn set_cost(&self, cost: Option<Vec<f32>>) -> Result<()> {
        match cost {
            None => self.calibration.clear(),
            Some(c) => self.calibration.put(Some(AutoBudget::new(c)?), None),
        }
        Ok(())
    }

    fn build(&self, memory: Option<SharedMemory>) -> Result<Box<dyn Drafter>> {
        let excluded = || self.excluded_set.clone();
        let memory = || {
            memory
                .clone()
                .ok_or_else(|| Error::InvalidState("a drafter with rows needs a memory".into()))
        };
        Ok(match &self.source {
            DraftSource::Ar => Box::new(Autoregressive),
            DraftSource::Pld {
                max_ngram,
                num_tokens,
            } => Box::new(PromptLookup::new(*max_ngram, *num_tokens, excluded())?),
            DraftSource::Recap(config) => Box::new(RecapDrafter::new(
                config.clone(),
                memory()?,
                &self.excluded,
            )?),
            DraftSource::Tr { levels, .. } => {
                Box::new(TokenRecycling::new(memory()?, levels, excluded())?)
            }
            DraftSource::Sam { max_len, fallback } => {
                let fallback = match fallback {
                    Some((levels, _, threshold)) => Some((
                        TokenRecycling::new(memory()?, levels, excluded())?,
                        *threshold,
                    )),
                    None => None,
                };
                Box::new(SamDrafter::new(*max_len, excluded(), fallback)?)
            }
            DraftSource::Suffix(config) => Box::new(SuffixTreeDrafter::with_history(
                config.clone(),
                excluded(),
                self.history.clone(),
            )?),
        })
    }
}

fn no_memory(_source: &DraftSource) -> Error {
    Error::invalid(
        "memory",
        "no memory (this drafter keeps no persistent memory; recap, tr and sam_tr do)",
        "one",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drafter::TopKRows;

    fn run(s: &mut DraftSession, prompt: &[u32], steps: usize) -> Vec<u32> {
        s.begin(prompt).unwrap();
        for _ in 0..steps {
            let tree = s.propose().unwrap().clone();
            // The "target" continues the prompt's pattern: token t is followed by t + 1.
            let pred: Vec<u32> = tree.tokens.iter().map(|&t| (t + 1) % 50).collect();
            let ids: Vec<u32> = pred.iter().flat_map(|&p| [p, (p + 7) % 50]).collect();
            let probs: Vec<f32> = pred.iter().flat_map(|_| [0.9, 0.05]).collect();
            let rows = TopKRows::new(&ids, &probs, 2, tree.len(), 50).unwrap();
            s.observe(&pred, &rows).unwrap();
        }
        s.history().to_vec()
    }

    fn recap() -> DraftSource {
        DraftSource::Recap(RecapConfig {
            k: 2,
            ..RecapConfig::default()
        })
    }

    #[test]
    fn sessions_are_independent_and_share_the_memory() {
        let d = SharedDrafter::new(recap(), 50, &[], None).unwrap();
        let mut a = d.session(None, None).unwrap();
        let mut b = d.session(None, None).unwrap();
        a.begin(&[1, 2, 3]).unwrap();
        b.begin(&[30, 31]).unwrap();
        assert_eq!(a.history(), &[1, 2, 3]);
        assert_eq!(b.history(), &[30, 31]);
        assert!(d.memory().unwrap().read().is_empty());
        run(&mut a, &[1, 2, 3], 3);
        // What a learned went into the drafter's memory, which b drafts from.
        assert!(!d.memory().unwrap().read().is_empty());
        assert_eq!(b.history(), &[30, 31]);
    }

    #[test]
    fn a_scope_memory_replaces_the_drafters_own_for_one_session() {
        let d = SharedDrafter::new(recap(), 50, &[], None).unwrap();
        let scope = SharedMemory::new(50, 2, 64).unwrap();
        let mut s = d.session(Some(scope.clone()), None).unwrap();
        run(&mut s, &[1, 2, 3], 3);
        assert!(!scope.read().is_empty());
        assert!(d.memory().unwrap().read().is_empty());
        let wrong = SharedMemory::new(50, 3, 64).unwrap();
        assert!(d.session(Some(wrong), None).is_err());
        let pld = SharedDrafter::new(
            DraftSource::Pld {
                max_ngram: 2,
                num_tokens: 4,
            },
            50,
            &[],
            None,
        )
        .unwrap();
        assert!(pld.session(Some(scope), None).is_err());
    }

    #[test]
    fn finished_sessions_hand_their_calibration_and_outputs_back() {
        let d = SharedDrafter::new(recap(), 50, &[], None).unwrap();
        d.set_cost_points(vec![1, 8, 32], vec![0.01, 0.012, 0.02])
            .unwrap();
        let before = d.calibration().get().unwrap().cost.unwrap().observed();
        let mut s = d.session(None, None).unwrap();
        s.begin(&[1, 2, 3]).unwrap();
        s.observe_timing(4, 0.011, Some(0.001)).unwrap();
        assert_eq!(
            d.calibration().get().unwrap().cost.unwrap().observed(),
            before
        );
        drop(s);
        assert_eq!(
            d.calibration().get().unwrap().cost.unwrap().observed(),
            before + 1
        );

        let suffix = SharedDrafter::new(
            DraftSource::Suffix(SuffixTreeConfig {
                cross_request: true,
                ..Default::default()
            }),
            50,
            &[],
            None,
        )
        .unwrap();
        let mut first = suffix.session(None, None).unwrap();
        let mut later = suffix.session(None, None).unwrap();
        run(&mut first, &[5, 6], 2); // commits 7, 8, ... after "5 6"
        later.begin(&[40, 6]).unwrap();
        assert_eq!(later.propose().unwrap().len(), 1); // opened before `first` ended
        first.finish();
        let mut next = suffix.session(None, None).unwrap();
        next.begin(&[40, 7]).unwrap(); // "7" was followed by "8" in first's output
        assert_eq!(next.propose().unwrap().tokens[..2], [7, 8]);
    }

    #[test]
    fn shared_drafter_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<SharedDrafter>();
        check::<Calibration>();
    }
}
