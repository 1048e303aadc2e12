//! The RECAP drafter: fused lookups in U/C/G -> best-first tree -> suffix graft.

use crate::drafter::{Drafter, TopKRows};
use crate::error::{check_tokens, Error, Result};
use crate::fusion::{Fuser, FusionMode, Priors, Proposal};
use crate::memory::{key_c, key_g, row_stats, ContextTables, UnigramTable};
use crate::peers::{SuffixTreeConfig, SuffixTreeDrafter};
use crate::search::{BestFirst, ProposalSource, SearchParams};
use crate::shared_memory::{SharedMemory, MAX_K};
use crate::suffix::SuffixAutomaton;
use crate::token_set::TokenSet;
use crate::tree::{context_before_last, DraftTree, NodeSource, NO_TOKEN};

#[derive(Clone, Debug, PartialEq)]
pub struct RecapConfig {
    /// Entries per memory row and per proposal.
    pub k: usize,
    pub search: SearchParams,
    pub priors: Priors,
    pub fusion: FusionMode,
    /// Suffix continuation tokens grafted from the root (0 disables the graft); with
    /// `suffix_adaptive`, the most such tokens.
    pub suffix_len: usize,
    /// Chain length min(suffix_len, 1 + 4 * match length) instead of a fixed suffix_len.
    pub suffix_adaptive: bool,
    /// Row capacity of each request-local table (C and G).
    pub context_capacity: usize,
    /// Also seed C and G (not only U) from the prompt.
    pub seed_context: bool,
    /// Reset U when a request starts (ablation).
    pub reset_unigram: bool,
    /// Also merge the tree a frequency-counted suffix tree over the request proposes
    /// (SuffixDecoding's, its defaults), as `Frequent` nodes the automatic budget prices
    /// by their own calibration. Off: the method as published.
    pub frequency: bool,
    /// With `frequency`: the frequency tree's own proposal is a floor the automatic budget
    /// keeps whenever it drafts (the nodes suffix decoding would verify), and the calibrated
    /// choice adds what pays beyond it. On a CPU, where every node costs, the calibration
    /// shared across requests overprices open text's nodes; the floor is what a request's
    /// own text supports.
    pub frequency_floor: bool,
}

impl Default for RecapConfig {
    fn default() -> Self {
        RecapConfig {
            k: 8,
            search: SearchParams::default(),
            priors: Priors::default(),
            fusion: FusionMode::default(),
            suffix_len: 4,
            suffix_adaptive: false,
            context_capacity: 8192,
            seed_context: false,
            reset_unigram: false,
            frequency: false,
            frequency_floor: false,
        }
    }
}

impl RecapConfig {
    pub const MAX_K: usize = MAX_K;
    pub const MAX_SUFFIX: usize = 256;
    /// Longest adaptive suffix chain by default (`suffix_len="auto"` with an automatic budget).
    pub const AUTO_SUFFIX_CAP: usize = 64;

    pub fn validate(&self) -> Result<()> {
        if !(1..=Self::MAX_K).contains(&self.k) {
            return Err(Error::invalid("k", format!("1..={}", Self::MAX_K), self.k));
        }
        self.search.validate()?;
        let Priors { g, c, u } = self.priors;
        if [g, c, u].iter().any(|p| !(p.is_finite() && *p >= 0.0)) || g + c + u <= 0.0 {
            return Err(Error::invalid(
                "priors",
                "three finite values >= 0 with a positive sum",
                format!("({g}, {c}, {u})"),
            ));
        }
        if self.suffix_len > Self::MAX_SUFFIX {
            return Err(Error::invalid(
                "suffix_len",
                format!("0..={}", Self::MAX_SUFFIX),
                self.suffix_len,
            ));
        }
        if self.context_capacity == 0 {
            return Err(Error::invalid("context_capacity", ">= 1", 0));
        }
        Ok(())
    }
}

/// Fused lookups for one node context: the `ProposalSource` the tree search reads.
struct FusedSource<'a> {
    u: &'a UnigramTable,
    ctx: &'a ContextTables,
    fuser: &'a mut Fuser,
    config: &'a RecapConfig,
}

impl ProposalSource for FusedSource<'_> {
    fn width(&self) -> usize {
        self.config.k
    }

    #[inline]
    fn children(&mut self, prev2: u32, prev: u32, token: u32, out: &mut Proposal) {
        let mode = self.config.fusion;
        let want_context = mode != FusionMode::Unigram;
        let g = (want_context && prev != NO_TOKEN && prev2 != NO_TOKEN)
            .then(|| self.ctx.g.get(key_g(prev2, prev, token)))
            .flatten();
        let c = (want_context && prev != NO_TOKEN)
            .then(|| self.ctx.c.get(key_c(prev, token)))
            .flatten();
        let u = self.u.get(token);
        self.fuser
            .fuse([g, c, u], mode, self.config.priors, self.config.k, out);
    }
}

pub struct RecapDrafter {
    config: RecapConfig,
    memory: SharedMemory,
    ctx: ContextTables,
    automaton: SuffixAutomaton,
    excluded: TokenSet,
    fuser: Fuser,
    search: BestFirst,
    /// The request's frequency-counted suffix tree (`RecapConfig::frequency`).
    frequent: Option<SuffixTreeDrafter>,
    graft_at: Vec<usize>,
}

impl RecapDrafter {
    pub fn new(config: RecapConfig, memory: SharedMemory, excluded: &[u32]) -> Result<Self> {
        config.validate()?;
        let vocab_size = memory.vocab_size();
        memory.check_fits(vocab_size, config.k)?;
        check_tokens("excluded", excluded, vocab_size)?;
        let excluded_set = TokenSet::from_ids(vocab_size, excluded);
        let frequent = if config.frequency {
            Some(SuffixTreeDrafter::new(
                SuffixTreeConfig::default(),
                excluded_set.clone(),
            )?)
        } else {
            None
        };
        Ok(RecapDrafter {
            frequent,
            graft_at: Vec::new(),
            ctx: ContextTables::new(config.k, config.context_capacity),
            config,
            memory,
            automaton: SuffixAutomaton::new(),
            excluded: excluded_set,
            fuser: Fuser::default(),
            search: BestFirst::default(),
        })
    }

    pub fn config(&self) -> &RecapConfig {
        &self.config
    }
    pub fn memory(&self) -> &SharedMemory {
        &self.memory
    }

    /// The fused children distribution of context (prev2, prev, token), as the tree search
    /// sees it (for inspection and benchmarks).
    pub fn fused_proposal(&mut self, prev2: u32, prev: u32, token: u32, out: &mut Proposal) {
        let u = self.memory.read();
        let mut source = FusedSource {
            u: &u,
            ctx: &self.ctx,
            fuser: &mut self.fuser,
            config: &self.config,
        };
        source.children(prev2, prev, token, out);
    }

    fn frequent_bytes(&self) -> usize {
        // The frequency tree's own excluded set is a copy of ours: counted once, above.
        self.frequent
            .as_ref()
            .map_or(0, |f| f.bytes().saturating_sub(self.excluded.bytes()))
    }

    /// Writes one row under the keys of context (prev2, prev, token).
    fn write_row(
        u: &mut UnigramTable,
        ctx: &mut ContextTables,
        keys: (u32, u32, u32),
        ids: &[u32],
        probs: &[f32],
        context: bool,
    ) {
        let (pp, p, t) = keys;
        let stats = Some(row_stats(probs));
        u.insert(t, ids, probs, stats);
        if context && p != NO_TOKEN {
            ctx.c.insert(key_c(p, t), ids, probs, stats);
            if pp != NO_TOKEN {
                ctx.g.insert(key_g(pp, p, t), ids, probs, stats);
            }
        }
    }
}

impl Drafter for RecapDrafter {
    fn name(&self) -> &'static str {
        "recap"
    }

    fn begin_request(&mut self, context: &[u32]) {
        self.ctx.clear();
        if self.config.reset_unigram {
            self.memory.write().clear();
        }
        self.automaton.clear();
        self.automaton.extend(context);
        if let Some(f) = &mut self.frequent {
            f.begin_request(context);
        }
    }

    fn seed(&mut self, context: &[u32], start: usize, rows: &TopKRows<'_>) {
        let mut u = self.memory.write();
        let end = (start + rows.rows()).min(context.len());
        for j in start..end {
            let t = context[j];
            if self.excluded.contains(t) {
                continue;
            }
            let [pp, p] = context_before_last(&context[..=j]);
            let (ids, probs) = rows.row(j - start);
            Self::write_row(
                &mut u,
                &mut self.ctx,
                (pp, p, t),
                ids,
                probs,
                self.config.seed_context,
            );
        }
    }

    fn propose(&mut self, history: &[u32], tree: &mut DraftTree) {
        tree.start(history);
        {
            let u = self.memory.read();
            let mut source = FusedSource {
                u: &u,
                ctx: &self.ctx,
                fuser: &mut self.fuser,
                config: &self.config,
            };
            self.search
                .build(tree, &self.config.search, &self.excluded, &mut source);
        }
        // Graft the suffix continuation as a chain from the root, reusing existing children;
        // adaptive chains grow with the match (SAM-Decoding's 1 + 4 * match length).
        let cap = self.config.suffix_len;
        let len = match self.automaton.longest_match() {
            Some(m) if self.config.suffix_adaptive => cap.min(1 + 4 * m.len),
            _ => cap,
        };
        let (cont, match_len) = self.automaton.continuation(len);
        let mut max_depth = self.config.search.max_depth;
        if self.config.suffix_adaptive {
            max_depth = max_depth.max(cap as u32); // adaptive chains may outgrow the search
        }
        let score = match_len as f32;
        tree.graft_chain(cont, score, &self.excluded, max_depth, NodeSource::Suffix);
        if let Some(f) = &mut self.frequent {
            let depth = max_depth.max(SuffixTreeConfig::default().max_spec as u32);
            let (nodes, matched) = f.best_candidate();
            let floor = self.config.frequency_floor;
            tree.graft_frequent(
                nodes,
                matched,
                &self.excluded,
                depth,
                floor,
                &mut self.graft_at,
            );
        }
        tree.into_preorder();
    }

    fn max_nodes(&self) -> usize {
        let frequent = self.frequent.as_ref().map_or(0, |f| f.max_nodes());
        self.config.search.budget + self.config.suffix_len + frequent
    }

    fn observe(&mut self, tree: &DraftTree, rows: &TopKRows<'_>, committed: &[u32]) {
        let mut u = self.memory.write();
        // Reverse preorder, last write wins: the first occurrence in preorder ends up stored.
        for i in (0..tree.len()).rev() {
            let t = tree.tokens[i];
            if self.excluded.contains(t) {
                continue;
            }
            let (pp, p) = tree.context_of(i);
            let (ids, probs) = rows.row(i);
            Self::write_row(&mut u, &mut self.ctx, (pp, p, t), ids, probs, true);
        }
        drop(u);
        self.automaton.extend(committed);
        if let Some(f) = &mut self.frequent {
            f.observe(tree, rows, committed);
        }
    }

    fn parts(&self) -> Vec<(&'static str, usize)> {
        vec![
            ("persistent U", self.memory.bytes()),
            ("request C+G", self.ctx.bytes()),
            ("request automaton", self.automaton.bytes()),
            ("excluded set", self.excluded.bytes()),
            ("request frequency tree", self.frequent_bytes()),
        ]
    }

    fn bytes(&self) -> usize {
        self.memory.bytes()
            + self.ctx.bytes()
            + self.automaton.bytes()
            + self.excluded.bytes()
            + self.frequent_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drafter(frequency: bool) -> RecapDrafter {
        let config = RecapConfig {
            k: 4,
            frequency,
            ..RecapConfig::default()
        };
        RecapDrafter::new(config, SharedMemory::new(64, 4, 64).unwrap(), &[]).unwrap()
    }

    #[test]
    fn the_frequency_tree_proposes_what_followed_the_context_most_often() {
        // After "5 6", 9 followed once, then 7 twice; the memories know nothing yet.
        let text = [5, 6, 9, 1, 5, 6, 7, 2, 5, 6, 7, 3, 5, 6];
        let mut tree = DraftTree::default();
        let mut with = drafter(true);
        with.begin_request(&text);
        with.propose(&text, &mut tree);
        let seven = (1..tree.len()).find(|&i| tree.tokens[i] == 7 && tree.depths[i] == 1);
        let seven = seven.expect("the most frequent continuation is drafted");
        assert!(matches!(
            tree.sources[seven],
            NodeSource::Frequent | NodeSource::Suffix | NodeSource::Agreed
        ));
        assert!(tree.len() <= with.max_nodes() + 1);
        // One copy chain cannot hold both continuations of "5 6"; the frequency tree adds
        // the other as a sibling.
        let firsts: Vec<u32> = (1..tree.len())
            .filter(|&i| tree.depths[i] == 1)
            .map(|i| tree.tokens[i])
            .collect();
        assert!(firsts.contains(&7) && firsts.contains(&9), "{firsts:?}");
        assert!(tree.sources.contains(&NodeSource::Frequent));
        let mut paper = drafter(false);
        paper.begin_request(&text);
        let mut plain = DraftTree::default();
        paper.propose(&text, &mut plain);
        assert!(plain
            .sources
            .iter()
            .all(|s| !matches!(s, NodeSource::Frequent | NodeSource::FrequentAgreed)));
        assert!(paper.max_nodes() < with.max_nodes());
    }

    #[test]
    fn a_request_drafts_while_another_holds_the_shared_memory_for_reading() {
        // Two sessions on one U: while one reads it (as its search does), the other's whole
        // proposal runs; with an exclusive lock it would wait until the first let go.
        let memory = SharedMemory::new(64, 4, 64).unwrap();
        let config = RecapConfig {
            k: 4,
            ..RecapConfig::default()
        };
        let mut other = RecapDrafter::new(config, memory.clone(), &[]).unwrap();
        let text = [5u32, 6, 9, 1, 5, 6, 7, 2, 5, 6];
        let reading = memory.read();
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut tree = DraftTree::default();
            other.begin_request(&text);
            other.propose(&text, &mut tree);
            done.send(tree.len()).unwrap();
        });
        let got = finished.recv_timeout(std::time::Duration::from_secs(20));
        drop(reading);
        assert!(got.expect("the proposal waited for the reader") >= 2);
    }
}
