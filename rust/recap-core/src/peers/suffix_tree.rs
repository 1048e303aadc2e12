//! SuffixDecoding-style drafting: a suffix trie (depth-capped) with occurrence counts over
//! this request's prompt + output, and optionally a second trie over earlier requests'
//! outputs. For every match length m of the current text's suffix, a tree is grown
//! best-first below the match: p(child) = p(node) * count(child) / count(children of node),
//! nodes below `min_prob` dropped, at most min(max_spec, floor(m * factor)) nodes. The tree
//! with the largest summed probability is proposed.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap;

use crate::drafter::{Drafter, TopKRows};
use crate::error::{Error, Result};
use crate::token_set::TokenSet;
use crate::tree::{DraftTree, NodeSource};

#[derive(Clone, Debug, PartialEq)]
pub struct SuffixTreeConfig {
    /// Trie depth (longest match considered).
    pub max_depth: usize,
    /// Most draft nodes per step.
    pub max_spec: usize,
    /// Draft nodes allowed per matched token.
    pub factor: f32,
    pub min_prob: f32,
    /// Also match against the outputs of earlier requests.
    pub cross_request: bool,
    /// Trie nodes over which the cross-request trie is cleared.
    pub global_capacity: usize,
}

impl Default for SuffixTreeConfig {
    fn default() -> Self {
        SuffixTreeConfig {
            max_depth: 64,
            max_spec: 16,
            factor: 1.0,
            min_prob: 0.1,
            cross_request: false,
            global_capacity: 1 << 21,
        }
    }
}

impl SuffixTreeConfig {
    pub fn validate(&self) -> Result<()> {
        if !(1..=256).contains(&self.max_depth) {
            return Err(Error::invalid("max_depth", "1..=256", self.max_depth));
        }
        if !(1..=4096).contains(&self.max_spec) {
            return Err(Error::invalid("max_spec", "1..=4096", self.max_spec));
        }
        if !(self.factor.is_finite() && self.factor > 0.0) {
            return Err(Error::invalid("factor", "a finite value > 0", self.factor));
        }
        if !(0.0..=1.0).contains(&self.min_prob) {
            return Err(Error::invalid(
                "min_prob",
                "a value in [0, 1]",
                self.min_prob,
            ));
        }
        Ok(())
    }
}

/// A suffix trie with counts. `active[d]` is the node of the text's suffix of length d.
#[derive(Clone, Debug, Default)]
struct CountTrie {
    token: Vec<u32>,
    count: Vec<u32>,
    /// Sum of the children's counts (the denominator of a child's probability).
    child_total: Vec<u32>,
    children: Vec<Vec<u32>>,
    edges: FxHashMap<u64, u32>,
    active: Vec<u32>,
}

#[inline]
fn edge(node: u32, token: u32) -> u64 {
    ((node as u64) << 32) | token as u64
}

impl CountTrie {
    fn clear(&mut self) {
        self.token.clear();
        self.count.clear();
        self.child_total.clear();
        self.children.clear();
        self.edges.clear();
        self.token.push(u32::MAX);
        self.count.push(0);
        self.child_total.push(0);
        self.children.push(Vec::new());
        self.active.clear();
        self.active.push(0);
    }

    fn len(&self) -> usize {
        self.token.len()
    }

    fn child(&self, node: u32, token: u32) -> Option<u32> {
        self.edges.get(&edge(node, token)).copied()
    }

    /// Appends a token to the indexed text: every suffix (up to `max_depth`) gains it.
    fn push(&mut self, token: u32, max_depth: usize) {
        let keep = self.active.len().min(max_depth);
        let mut next = Vec::with_capacity(keep + 1);
        next.push(0);
        for d in 0..keep {
            let node = self.active[d];
            let child = match self.child(node, token) {
                Some(c) => c,
                None => {
                    let c = self.token.len() as u32;
                    self.token.push(token);
                    self.count.push(0);
                    self.child_total.push(0);
                    self.children.push(Vec::new());
                    self.children[node as usize].push(c);
                    self.edges.insert(edge(node, token), c);
                    c
                }
            };
            self.count[child as usize] += 1;
            self.child_total[node as usize] += 1;
            next.push(child);
        }
        self.active = next;
    }

    /// Starts a new document (the next push begins a fresh suffix).
    fn end_document(&mut self) {
        self.active.clear();
        self.active.push(0);
    }

    fn bytes(&self) -> usize {
        self.token.capacity() * 12
            + self.children.capacity() * 24
            + self
                .children
                .iter()
                .map(|c| c.capacity() * 4)
                .sum::<usize>()
            + self.edges.capacity() * 16
            + self.active.capacity() * 4
    }
}

/// Nodes of `trie` matching the suffixes of a text it does not index: follows each new
/// token from every current match, without inserting.
#[derive(Clone, Debug, Default)]
struct Matcher {
    nodes: Vec<u32>,
}

impl Matcher {
    fn reset(&mut self) {
        self.nodes.clear();
        self.nodes.push(0);
    }
    fn push(&mut self, trie: &CountTrie, token: u32, max_depth: usize) {
        let mut next = vec![0];
        for &n in self.nodes.iter().take(max_depth) {
            match trie.child(n, token) {
                Some(c) => next.push(c),
                None => break, // longer suffixes cannot match if a shorter one does not
            }
        }
        self.nodes = next;
    }
}

#[derive(Clone, Copy, Debug)]
struct Open {
    prob: f32,
    trie_node: u32,
    parent: u32,
}
impl PartialEq for Open {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Open {}
impl PartialOrd for Open {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Open {
    fn cmp(&self, o: &Self) -> Ordering {
        self.prob
            .total_cmp(&o.prob)
            .then(o.trie_node.cmp(&self.trie_node))
    }
}

/// One candidate draft: (parent index in the candidate, -1 = root; token; probability).
#[derive(Clone, Debug, Default)]
struct Candidate {
    nodes: Vec<(i32, u32, f32)>,
    score: f32,
    /// The match length it was grown below.
    matched: usize,
}

/// The cross-request trie over earlier outputs, shared by every session of one drafter.
/// Sessions read an immutable snapshot (`Arc`), so a request that ends while another drafts
/// copies the trie once instead of moving nodes under the other's matches.
#[derive(Clone, Debug, Default)]
pub struct SuffixHistory(Arc<Mutex<Arc<CountTrie>>>);

impl SuffixHistory {
    pub fn new() -> Self {
        let mut trie = CountTrie::default();
        trie.clear();
        SuffixHistory(Arc::new(Mutex::new(Arc::new(trie))))
    }

    fn snapshot(&self) -> Arc<CountTrie> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Indexes one finished request's output; returns the trie with it.
    fn add(&self, output: &[u32], config: &SuffixTreeConfig) -> Arc<CountTrie> {
        let mut guard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let trie = Arc::make_mut(&mut guard);
        if trie.len() + output.len() * config.max_depth > config.global_capacity {
            trie.clear();
        }
        for &t in output {
            trie.push(t, config.max_depth);
        }
        trie.end_document();
        guard.clone()
    }

    pub fn bytes(&self) -> usize {
        self.snapshot().bytes()
    }
}

pub struct SuffixTreeDrafter {
    config: SuffixTreeConfig,
    excluded: TokenSet,
    local: CountTrie,
    global: Arc<CountTrie>,
    history: SuffixHistory,
    global_match: Matcher,
    /// Prompt length and tokens generated so far in this request (fed to `global` later).
    prompt_len: usize,
    output: Vec<u32>,
    heap: BinaryHeap<Open>,
    scratch: Candidate,
    best: Candidate,
}

impl SuffixTreeDrafter {
    /// A drafter with its own cross-request history.
    pub fn new(config: SuffixTreeConfig, excluded: TokenSet) -> Result<Self> {
        Self::with_history(config, excluded, SuffixHistory::new())
    }

    /// A session's drafter over the shared `history` of earlier outputs.
    pub fn with_history(
        config: SuffixTreeConfig,
        excluded: TokenSet,
        history: SuffixHistory,
    ) -> Result<Self> {
        config.validate()?;
        let mut d = SuffixTreeDrafter {
            config,
            excluded,
            local: CountTrie::default(),
            global: history.snapshot(),
            history,
            global_match: Matcher::default(),
            prompt_len: 0,
            output: Vec::new(),
            heap: BinaryHeap::new(),
            scratch: Candidate::default(),
            best: Candidate::default(),
        };
        d.local.clear();
        d.global_match.reset();
        Ok(d)
    }

    fn append(&mut self, tokens: &[u32]) {
        let depth = self.config.max_depth;
        for &t in tokens {
            self.local.push(t, depth);
            if self.config.cross_request {
                self.global_match.push(&self.global, t, depth);
            }
        }
    }

    /// Grows the best tree below `node` of `trie` into `self.scratch`.
    fn grow(
        trie: &CountTrie,
        node: u32,
        limit: usize,
        cfg: &SuffixTreeConfig,
        excluded: &TokenSet,
        heap: &mut BinaryHeap<Open>,
        out: &mut Candidate,
    ) {
        out.nodes.clear();
        out.score = 0.0;
        heap.clear();
        let push_children = |heap: &mut BinaryHeap<Open>, n: u32, p: f32, parent: u32| {
            let total = trie.child_total[n as usize] as f32;
            for &c in &trie.children[n as usize] {
                let prob = p * trie.count[c as usize] as f32 / total;
                if prob >= cfg.min_prob && !excluded.contains(trie.token[c as usize]) {
                    heap.push(Open {
                        prob,
                        trie_node: c,
                        parent,
                    });
                }
            }
        };
        push_children(heap, node, 1.0, u32::MAX);
        while out.nodes.len() < limit {
            let Some(o) = heap.pop() else { break };
            let parent = if o.parent == u32::MAX {
                -1
            } else {
                o.parent as i32
            };
            out.nodes
                .push((parent, trie.token[o.trie_node as usize], o.prob));
            out.score += o.prob;
            let me = (out.nodes.len() - 1) as u32;
            push_children(heap, o.trie_node, o.prob, me);
        }
    }

    /// Considers every match length in `matches` (node of the suffix of length d at d).
    fn best_over(&mut self, global: bool) {
        let trie: &CountTrie = if global { &self.global } else { &self.local };
        let matches = if global {
            &self.global_match.nodes
        } else {
            &trie.active
        };
        for (m, &node) in matches.iter().enumerate().skip(1) {
            if trie.child_total[node as usize] == 0 {
                continue;
            }
            let limit = ((m as f32 * self.config.factor) as usize).clamp(1, self.config.max_spec);
            Self::grow(
                trie,
                node,
                limit,
                &self.config,
                &self.excluded,
                &mut self.heap,
                &mut self.scratch,
            );
            if self.scratch.score > self.best.score {
                self.scratch.matched = m;
                std::mem::swap(&mut self.scratch, &mut self.best);
            }
        }
    }
}

impl SuffixTreeDrafter {
    /// The best tree below the current text's matches, as (parent among these nodes or -1
    /// for the root, token, path probability), parents first: what `propose` drafts; and the
    /// length of the match it grew below.
    pub fn best_candidate(&mut self) -> (&[(i32, u32, f32)], usize) {
        self.best.nodes.clear();
        self.best.score = 0.0;
        self.best.matched = 0;
        self.best_over(false);
        if self.config.cross_request {
            self.best_over(true);
        }
        (&self.best.nodes, self.best.matched)
    }
}

impl Drafter for SuffixTreeDrafter {
    fn name(&self) -> &'static str {
        "suffix"
    }
    fn begin_request(&mut self, context: &[u32]) {
        self.end_request(); // a drafter reused without end_request still hands its output over
        if self.config.cross_request {
            self.global = self.history.snapshot();
        }
        self.output.clear();
        self.prompt_len = context.len();
        self.local.clear();
        self.global_match.reset();
        self.append(context);
    }
    fn propose(&mut self, history: &[u32], tree: &mut DraftTree) {
        tree.start(history);
        self.best_candidate();
        let mut index = Vec::with_capacity(self.best.nodes.len());
        for &(parent, token, prob) in &self.best.nodes {
            let at = if parent < 0 {
                0
            } else {
                index[parent as usize]
            };
            index.push(tree.push(at, token, prob, NodeSource::Suffix));
        }
        tree.into_preorder();
    }
    fn max_nodes(&self) -> usize {
        self.config.max_spec
    }
    fn end_request(&mut self) {
        if self.config.cross_request && !self.output.is_empty() {
            self.global = self.history.add(&self.output, &self.config);
        }
        self.output.clear();
    }
    fn observe(&mut self, _tree: &DraftTree, _rows: &TopKRows<'_>, committed: &[u32]) {
        self.output.extend_from_slice(committed);
        self.append(committed);
    }
    fn parts(&self) -> Vec<(&'static str, usize)> {
        vec![
            ("request tree", self.local.bytes()),
            ("cross-request tree", self.global.bytes()),
            ("output", self.output.capacity() * 4),
            ("excluded set", self.excluded.bytes()),
        ]
    }

    fn bytes(&self) -> usize {
        self.local.bytes()
            + self.global.bytes()
            + self.output.capacity() * 4
            + self.excluded.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draft(d: &mut SuffixTreeDrafter, history: &[u32]) -> DraftTree {
        let mut t = DraftTree::default();
        d.propose(history, &mut t);
        t
    }

    #[test]
    fn counts_weigh_continuations_and_longer_matches_allow_more_nodes() {
        let mut d = SuffixTreeDrafter::new(SuffixTreeConfig::default(), TokenSet::new(16)).unwrap();
        // "1 2" is followed by 3 twice and 4 once; the longest match ("9 1 2" and longer,
        // back to the start) was followed once by 3 and once by 4.
        let text = [1u32, 2, 3, 9, 1, 2, 3, 9, 1, 2, 4, 9, 1, 2];
        d.begin_request(&text);
        let t = draft(&mut d, &text);
        assert_eq!(t.tokens[0], 2);
        // The best tree sums to 1.5: from "9 1 2" (m = 3, three nodes of probability 1/2);
        // "1 2" alone (m = 2) gives 3 (2/3) then 9 (2/3), 1.33.
        assert_eq!(t.len(), 4);
        assert_eq!(t.tokens[1], 3);
        assert!(t.scores[1..].iter().all(|&p| (p - 0.5).abs() < 1e-6));
        // With a two-deep trie only "2" and "1 2" match: 3 wins with 2/3.
        let cfg = SuffixTreeConfig {
            max_depth: 2,
            ..Default::default()
        };
        let mut d = SuffixTreeDrafter::new(cfg, TokenSet::new(16)).unwrap();
        d.begin_request(&text);
        let t = draft(&mut d, &text);
        assert_eq!(t.tokens, vec![2, 3]); // the trie is two deep: nothing below "2 3"
        assert!((t.scores[1] - 2.0 / 3.0).abs() < 1e-6);
    }

    #[test]
    fn trie_counts_match_naive_substring_counts() {
        let text: Vec<u32> = (0..200u32).map(|i| (i * 7 + i / 3) % 5).collect();
        let mut trie = CountTrie::default();
        trie.clear();
        for &t in &text {
            trie.push(t, 6);
        }
        for len in 1..=4 {
            for start in 0..text.len() - len {
                let pat = &text[start..start + len];
                let mut node = 0;
                for &t in pat {
                    node = trie.child(node, t).unwrap();
                }
                let naive = text.windows(len).filter(|w| *w == pat).count();
                assert_eq!(trie.count[node as usize] as usize, naive);
            }
        }
    }

    #[test]
    fn cross_request_trie_supplies_earlier_outputs() {
        let cfg = SuffixTreeConfig {
            cross_request: true,
            ..Default::default()
        };
        let mut d = SuffixTreeDrafter::new(cfg, TokenSet::new(32)).unwrap();
        d.begin_request(&[20]);
        let tree = draft(&mut d, &[20]);
        let rows_ids = vec![0u32; tree.len()];
        let rows_p = vec![0f32; tree.len()];
        let rows = TopKRows::new(&rows_ids, &rows_p, 1, tree.len(), 32).unwrap();
        d.observe(&tree, &rows, &[5, 6, 7, 8]);
        // A new request ending in "5 6" finds "7 8" in the earlier output.
        d.begin_request(&[21, 5, 6]);
        let t = draft(&mut d, &[21, 5, 6]);
        assert_eq!(&t.tokens[..3], &[6, 7, 8]);
    }
}
