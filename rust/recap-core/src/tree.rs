//! The draft tree every drafter produces and the verifier consumes: flat arrays with the
//! root (the last committed token) at index 0, parents before children.
//!
//! Drafters append nodes in any parent-first order, then call `into_preorder`, which orders
//! siblings by insertion (drafters insert best-first, so rank order) and makes the top-rank
//! chain a contiguous prefix whose KV needs no compaction when it is accepted.

use crate::token_set::TokenSet;

/// Where a node came from (reported in statistics; the verifier does not care).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum NodeSource {
    Root = 0,
    /// A prediction memory (RECAP's tree search, Token Recycling's adjacency).
    Search = 1,
    /// Copied from earlier text (suffix graft, prompt lookup, SAM, suffix tree). Their score
    /// is the match length that produced them (the suffix tree stores its probability).
    Suffix = 2,
    /// Copied from earlier text where a prediction memory proposed the same token (a search
    /// node the graft reused); its score is the match length, as for `Suffix`.
    Agreed = 3,
    /// From a frequency-counted suffix tree over the request (SuffixDecoding's): its score is
    /// `frequent_score(p, m)`, the tree's path probability p (count(child) / count(siblings)
    /// down from the match) and the length m of the match it grew below.
    Frequent = 4,
    /// A `Frequent` node the memory's search also proposed (a search node it reused).
    FrequentAgreed = 5,
}

/// Match-length classes of frequency nodes: 1, 2-3, 4-7, 8 and more tokens.
pub const FREQUENT_MATCHES: usize = 4;

/// The score of a frequency node: its path probability p in (0, 1] plus 2 x its match
/// class, so one number carries both (`frequent_parts` reads them back).
pub fn frequent_score(p: f32, matched: usize) -> f32 {
    let class = (usize::BITS - (matched | 1).leading_zeros() - 1) as usize;
    p.clamp(1e-6, 1.0) + 2.0 * class.min(FREQUENT_MATCHES - 1) as f32
}

/// (path probability, match class) of a frequency node's score.
pub fn frequent_parts(score: f32) -> (f32, usize) {
    let class = ((score.max(0.0) - 1e-7) / 2.0).floor() as usize;
    let class = class.min(FREQUENT_MATCHES - 1);
    (score - 2.0 * class as f32, class)
}

/// A copied-text node after a match shorter than this that the frequency tree also proposes is
/// priced as a frequency node: after a short match the counts of what followed it are the
/// better evidence, after a long one the match is.
pub const SHORT_CHAIN_MATCH: usize = 8;

/// Sentinel for "no token" in contexts (the request started fewer than two tokens ago).
pub const NO_TOKEN: u32 = u32::MAX;

/// Children lists of a parent-first tree in CSR form, siblings in index order: the children
/// of node v are `children[start[v]..start[v + 1]]`.
pub fn children_csr(parents: &[i32], start: &mut Vec<u32>, children: &mut Vec<u32>) {
    let n = parents.len();
    start.clear();
    start.resize(n + 1, 0);
    for &p in &parents[1.min(n)..] {
        start[p as usize + 1] += 1;
    }
    for i in 0..n {
        start[i + 1] += start[i];
    }
    children.clear();
    children.resize(n.saturating_sub(1), 0);
    let mut fill: Vec<u32> = start[..n].to_vec();
    for (i, &p) in parents.iter().enumerate().skip(1) {
        children[fill[p as usize] as usize] = i as u32;
        fill[p as usize] += 1;
    }
}

/// The (prev2, prev) tokens before the last token of `tokens`; NO_TOKEN where absent.
pub fn context_before_last(tokens: &[u32]) -> [u32; 2] {
    let n = tokens.len();
    let at = |back: usize| {
        if n > back {
            tokens[n - 1 - back]
        } else {
            NO_TOKEN
        }
    };
    [at(2), at(1)]
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct DraftTree {
    pub tokens: Vec<u32>,
    /// Parent index, -1 for the root.
    pub parents: Vec<i32>,
    pub depths: Vec<u32>,
    /// Best-first path score (1 for the root; chain drafters use their own).
    pub scores: Vec<f32>,
    pub sources: Vec<NodeSource>,
    /// Nodes the automatic budget keeps whenever it drafts (`graft_frequent` with `floor`:
    /// the request-local frequency tree's own proposal), whatever their calibrated price.
    pub floor: Vec<bool>,
    /// (prev2, prev) committed tokens before the root; NO_TOKEN where absent.
    pub root_context: [u32; 2],
    scratch_order: Vec<u32>,
    scratch_start: Vec<u32>,
    scratch_stack: Vec<u32>,
}

impl DraftTree {
    pub fn len(&self) -> usize {
        self.tokens.len()
    }
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Starts a new tree holding only `root`, whose committed context is `root_context`.
    pub fn reset(&mut self, root: u32, root_context: [u32; 2]) {
        self.tokens.clear();
        self.parents.clear();
        self.depths.clear();
        self.scores.clear();
        self.sources.clear();
        self.floor.clear();
        self.root_context = root_context;
        self.tokens.push(root);
        self.parents.push(-1);
        self.depths.push(0);
        self.scores.push(1.0);
        self.sources.push(NodeSource::Root);
        self.floor.push(false);
    }

    /// Starts a new tree rooted at the last committed token of `history` (non-empty).
    pub fn start(&mut self, history: &[u32]) {
        self.reset(history[history.len() - 1], context_before_last(history));
    }

    /// Appends a child of `parent` and returns its index.
    pub fn push(&mut self, parent: usize, token: u32, score: f32, source: NodeSource) -> usize {
        debug_assert!(parent < self.len());
        let depth = self.depths[parent] + 1;
        self.tokens.push(token);
        self.parents.push(parent as i32);
        self.depths.push(depth);
        self.scores.push(score);
        self.sources.push(source);
        self.floor.push(false);
        self.len() - 1
    }

    /// Appends `tokens` as a chain below the root, reusing existing children, and stops at
    /// the first excluded token or at `max_depth`. Its nodes get `score` (copied-text
    /// drafters store the match length there) and `source`, reused ones too: a token both the
    /// search and the copy propose is priced as the copy (the match is evidence about this
    /// very context; a search score's rate is an average over all of them), and the chain
    /// below it keeps its price. A reused search node becomes `Agreed` when `source` is
    /// `Suffix`: a copy the memory also predicts holds far more often than one it does not,
    /// so the budget prices the two apart. Returns the number of tokens placed.
    pub fn graft_chain(
        &mut self,
        tokens: &[u32],
        score: f32,
        excluded: &TokenSet,
        max_depth: u32,
        source: NodeSource,
    ) -> usize {
        let mut node = 0usize;
        for (placed, &tok) in tokens.iter().enumerate() {
            if excluded.contains(tok) || self.depths[node] >= max_depth {
                return placed;
            }
            node = match self.child_with_token(node, tok) {
                Some(existing) => {
                    self.scores[existing] = score;
                    let agreed = source == NodeSource::Suffix
                        && self.sources[existing] == NodeSource::Search;
                    self.sources[existing] = if agreed { NodeSource::Agreed } else { source };
                    existing
                }
                None => self.push(node, tok, score, source),
            };
        }
        tokens.len()
    }

    /// Merges a frequency tree (`nodes`: parent index among `nodes` or -1 for the root,
    /// token, path probability; parents first; grown below a match of `matched` tokens) into
    /// this tree, reusing existing children. A reused search node becomes `FrequentAgreed`
    /// and takes the frequency score; so does a reused copied-text node after a match shorter
    /// than SHORT_CHAIN_MATCH (`Frequent` where it was copied alone); after a longer match it
    /// keeps its chain price (the match is the stronger evidence). Nodes below an excluded
    /// token or past `max_depth` are dropped. With `floor`, every placed node (and so its path
    /// from the root) is marked `floor`. Returns the nodes added.
    pub fn graft_frequent(
        &mut self,
        nodes: &[(i32, u32, f32)],
        matched: usize,
        excluded: &TokenSet,
        max_depth: u32,
        floor: bool,
        at: &mut Vec<usize>,
    ) -> usize {
        const DROPPED: usize = usize::MAX;
        at.clear();
        let mut added = 0;
        for &(parent, tok, prob) in nodes {
            let parent = if parent < 0 { 0 } else { at[parent as usize] };
            if parent == DROPPED || excluded.contains(tok) || self.depths[parent] >= max_depth {
                at.push(DROPPED);
                continue;
            }
            let node = match self.child_with_token(parent, tok) {
                Some(existing) => {
                    // A chain's score is the length of the match that produced it.
                    let short = || self.scores[existing] < SHORT_CHAIN_MATCH as f32;
                    let source = match self.sources[existing] {
                        NodeSource::Search => Some(NodeSource::FrequentAgreed),
                        NodeSource::Agreed if short() => Some(NodeSource::FrequentAgreed),
                        NodeSource::Suffix if short() => Some(NodeSource::Frequent),
                        _ => None,
                    };
                    if let Some(source) = source {
                        self.sources[existing] = source;
                        self.scores[existing] = frequent_score(prob, matched);
                    }
                    existing
                }
                None => {
                    added += 1;
                    self.push(
                        parent,
                        tok,
                        frequent_score(prob, matched),
                        NodeSource::Frequent,
                    )
                }
            };
            self.floor[node] |= floor;
            at.push(node);
        }
        added
    }

    /// The child of `parent` carrying `token`, if any.
    pub fn child_with_token(&self, parent: usize, token: u32) -> Option<usize> {
        (1..self.len()).find(|&i| self.parents[i] == parent as i32 && self.tokens[i] == token)
    }

    /// The (prev2, prev) context of node `i`: its grandparent and parent tokens on its own
    /// path, continuing into the committed tokens before the root.
    pub fn context_of(&self, i: usize) -> (u32, u32) {
        let [pp_root, p_root] = self.root_context;
        if i == 0 {
            return (pp_root, p_root);
        }
        let p = self.parents[i] as usize;
        let prev = self.tokens[p];
        let prev2 = if p == 0 {
            p_root
        } else {
            self.tokens[self.parents[p] as usize]
        };
        (prev2, prev)
    }

    /// Reorders the nodes into preorder, siblings in insertion order. Parents must precede
    /// their children (true for every tree built with `push`).
    pub fn into_preorder(&mut self) {
        let n = self.len();
        if n <= 2 {
            return;
        }
        let (start, children) = (&mut self.scratch_start, &mut self.scratch_order);
        children_csr(&self.parents, start, children);
        // Iterative DFS; `order[new] = old`.
        let mut order = Vec::with_capacity(n);
        let stack = &mut self.scratch_stack;
        stack.clear();
        stack.push(0);
        while let Some(v) = stack.pop() {
            order.push(v as usize);
            let (a, b) = (start[v as usize] as usize, start[v as usize + 1] as usize);
            stack.extend(children[a..b].iter().rev());
        }
        let mut new_index = vec![0i32; n];
        for (new, &old) in order.iter().enumerate() {
            new_index[old] = new as i32;
        }
        self.tokens = order.iter().map(|&o| self.tokens[o]).collect();
        self.parents = order
            .iter()
            .map(|&o| match self.parents[o] {
                -1 => -1,
                p => new_index[p as usize],
            })
            .collect();
        self.depths = order.iter().map(|&o| self.depths[o]).collect();
        self.scores = order.iter().map(|&o| self.scores[o]).collect();
        self.sources = order.iter().map(|&o| self.sources[o]).collect();
        self.floor = order.iter().map(|&o| self.floor[o]).collect();
    }

    /// Keeps the nodes marked in `keep` (the root and every kept node's parent must be
    /// kept), in their order; a subset of a preorder closed under parents stays a preorder.
    pub fn retain(&mut self, keep: &[bool]) {
        let n = self.len();
        assert_eq!(keep.len(), n, "one flag per node");
        let remap = &mut self.scratch_stack;
        remap.clear();
        remap.resize(n, u32::MAX);
        let mut w = 0usize;
        for i in 0..n {
            if !keep[i] {
                continue;
            }
            remap[i] = w as u32;
            let parent = match self.parents[i] {
                -1 => -1,
                p => {
                    let q = remap[p as usize];
                    assert!(q != u32::MAX, "node {i} kept without its parent {p}");
                    q as i32
                }
            };
            self.tokens[w] = self.tokens[i];
            self.parents[w] = parent;
            self.depths[w] = self.depths[i];
            self.scores[w] = self.scores[i];
            self.sources[w] = self.sources[i];
            self.floor[w] = self.floor[i];
            w += 1;
        }
        self.tokens.truncate(w);
        self.parents.truncate(w);
        self.depths.truncate(w);
        self.scores.truncate(w);
        self.sources.truncate(w);
        self.floor.truncate(w);
    }

    /// Writes the T x T ancestor-or-self mask (row i: the nodes node i may attend to) into
    /// `out` (row-major, length T*T): `attend` where node i sees node j, `masked` elsewhere.
    /// Parents must precede children.
    fn write_mask<T: Copy>(&self, out: &mut [T], attend: T, masked: T) {
        let n = self.len();
        assert_eq!(out.len(), n * n, "mask buffer must hold T*T entries");
        out.fill(masked);
        for i in 0..n {
            if let Ok(p) = usize::try_from(self.parents[i]) {
                let (before, row) = out.split_at_mut(i * n);
                row[..n].copy_from_slice(&before[p * n..p * n + n]);
            }
            out[i * n + i] = attend;
        }
    }

    /// The ancestor mask as booleans.
    pub fn write_ancestor_mask(&self, out: &mut [bool]) {
        self.write_mask(out, true, false);
    }

    /// The additive form of the ancestor mask: 0 where row i may attend, `masked` elsewhere.
    pub fn write_additive_mask(&self, out: &mut [f32], masked: f32) {
        self.write_mask(out, 0.0, masked);
    }

    pub fn ancestor_mask(&self) -> Vec<bool> {
        let mut m = vec![false; self.len() * self.len()];
        self.write_ancestor_mask(&mut m);
        m
    }

    /// Path from the root to `node`, root first.
    pub fn path_to(&self, node: usize) -> Vec<usize> {
        let mut path = vec![node];
        let mut v = node;
        while self.parents[v] >= 0 {
            v = self.parents[v] as usize;
            path.push(v);
        }
        path.reverse();
        path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A random parent-first tree: node i's parent is drawn from 0..i.
    fn arb_tree() -> impl Strategy<Value = DraftTree> {
        proptest::collection::vec((any::<u32>(), 0u32..1000), 0..40).prop_map(|spec| {
            let mut t = DraftTree::default();
            t.reset(0, [NO_TOKEN, NO_TOKEN]);
            for (i, (pick, tok)) in spec.into_iter().enumerate() {
                let parent = (pick as usize) % (i + 1);
                t.push(parent, tok, 0.5, NodeSource::Search);
            }
            t
        })
    }

    fn naive_ancestor(t: &DraftTree, i: usize, j: usize) -> bool {
        let mut v = i as i32;
        while v >= 0 {
            if v as usize == j {
                return true;
            }
            v = t.parents[v as usize];
        }
        false
    }

    proptest! {
        #[test]
        fn mask_matches_a_naive_ancestor_matrix(t in arb_tree()) {
            let m = t.ancestor_mask();
            let n = t.len();
            let mut additive = vec![1.0f32; n * n];
            t.write_additive_mask(&mut additive, -7.0);
            for i in 0..n {
                for j in 0..n {
                    prop_assert_eq!(m[i * n + j], naive_ancestor(&t, i, j));
                    let want = if m[i * n + j] { 0.0 } else { -7.0 };
                    prop_assert_eq!(additive[i * n + j], want);
                }
            }
        }

        #[test]
        fn retain_keeps_a_parent_closed_subset_in_order(t in arb_tree(), seed in any::<u64>()) {
            let mut p = t.clone();
            p.into_preorder();
            let n = p.len();
            let mut keep = vec![false; n];
            keep[0] = true;
            for i in 1..n {
                let coin = (seed.rotate_left(i as u32 % 64) ^ i as u64) & 1 == 1;
                keep[i] = coin && keep[p.parents[i] as usize];
            }
            let mut r = p.clone();
            r.retain(&keep);
            let kept: Vec<usize> = (0..n).filter(|&i| keep[i]).collect();
            prop_assert_eq!(r.len(), kept.len());
            for (new, &old) in kept.iter().enumerate() {
                prop_assert_eq!(r.tokens[new], p.tokens[old]);
                prop_assert_eq!(r.depths[new], p.depths[old]);
                if new > 0 {
                    prop_assert_eq!(kept[r.parents[new] as usize], p.parents[old] as usize);
                }
            }
        }

        #[test]
        fn preorder_keeps_the_tree_and_puts_parents_first(t in arb_tree()) {
            let mut p = t.clone();
            p.into_preorder();
            prop_assert_eq!(p.len(), t.len());
            // Same multiset of root paths (as token sequences).
            let paths = |t: &DraftTree| {
                let mut v: Vec<Vec<u32>> = (0..t.len())
                    .map(|i| t.path_to(i).iter().map(|&j| t.tokens[j]).collect())
                    .collect();
                v.sort();
                v
            };
            prop_assert_eq!(paths(&p), paths(&t));
            for i in 1..p.len() {
                let par = p.parents[i];
                prop_assert!(par >= 0 && (par as usize) < i);
                prop_assert_eq!(p.depths[i], p.depths[par as usize] + 1);
                // Preorder: the parent is the nearest earlier node of smaller depth.
                let nearest = (0..i).rev().find(|&j| p.depths[j] < p.depths[i]).unwrap();
                prop_assert_eq!(nearest as i32, par);
            }
        }
    }

    #[test]
    fn first_children_form_a_contiguous_prefix() {
        let mut t = DraftTree::default();
        t.reset(10, [NO_TOKEN, NO_TOKEN]);
        let a = t.push(0, 11, 0.6, NodeSource::Search);
        t.push(0, 12, 0.3, NodeSource::Search);
        let c = t.push(a, 13, 0.4, NodeSource::Search);
        t.push(c, 14, 0.2, NodeSource::Search);
        t.into_preorder();
        assert_eq!(t.tokens, vec![10, 11, 13, 14, 12]);
        assert_eq!(t.parents, vec![-1, 0, 1, 2, 0]);
    }

    #[test]
    fn a_graft_marks_the_search_nodes_it_reuses_as_agreed() {
        let mut t = DraftTree::default();
        t.reset(10, [NO_TOKEN, NO_TOKEN]);
        let a = t.push(0, 11, 0.6, NodeSource::Search);
        t.push(a, 12, 0.3, NodeSource::Search);
        let none = TokenSet::from_ids(64, &[]);
        assert_eq!(
            t.graft_chain(&[11, 13, 14], 3.0, &none, 8, NodeSource::Suffix),
            3
        );
        let source_of = |tok: u32| t.sources[t.tokens.iter().position(|&x| x == tok).unwrap()];
        assert_eq!(source_of(11), NodeSource::Agreed); // the search proposed it too
        assert_eq!(source_of(12), NodeSource::Search); // off the chain: untouched
        assert_eq!(source_of(13), NodeSource::Suffix); // the copy alone
        assert_eq!(source_of(14), NodeSource::Suffix);
        assert!(t.scores[a] == 3.0); // priced by its match, as every chain node
    }

    #[test]
    fn a_frequency_graft_reuses_nodes_and_drops_what_it_cannot_place() {
        let mut t = DraftTree::default();
        t.reset(10, [NO_TOKEN, NO_TOKEN]);
        let a = t.push(0, 11, 0.6, NodeSource::Search);
        let none = TokenSet::from_ids(64, &[]);
        t.graft_chain(&[20, 21], 12.0, &none, 8, NodeSource::Suffix);
        let banned = TokenSet::from_ids(64, &[30]);
        // 11 (reuses the search node), 12 below it, 20 (reuses the copy), 30 (excluded)
        // and 31 below the excluded one, 13 past the depth limit.
        let nodes = [
            (-1, 11, 0.9),
            (0, 12, 0.5),
            (-1, 20, 0.8),
            (-1, 30, 0.4),
            (3, 31, 0.3),
            (1, 13, 0.2),
        ];
        let mut at = Vec::new();
        assert_eq!(t.graft_frequent(&nodes, 3, &banned, 2, true, &mut at), 1);
        let source_of = |tok: u32| {
            t.tokens
                .iter()
                .position(|&x| x == tok)
                .map(|i| t.sources[i])
        };
        assert_eq!(source_of(11), Some(NodeSource::FrequentAgreed));
        let (p, class) = frequent_parts(t.scores[a]);
        assert!((p - 0.9).abs() < 1e-5 && class == 1); // a 3-token match: class 1
        assert_eq!(source_of(12), Some(NodeSource::Frequent));
        assert_eq!(source_of(20), Some(NodeSource::Suffix)); // a long copy keeps its price
        assert_eq!(source_of(30), None);
        assert_eq!(source_of(31), None);
        assert_eq!(source_of(13), None);
        assert_eq!(t.len(), 5);
        // The placed nodes are the floor, reused ones included; the rest is not.
        let floor_of = |tok: u32| t.floor[t.tokens.iter().position(|&x| x == tok).unwrap()];
        assert!(floor_of(11) && floor_of(12) && floor_of(20));
        assert!(!t.floor[0] && t.floor.len() == t.len());
        assert_eq!(t.floor.iter().filter(|&&f| f).count(), 3);
        let mut keep = vec![true; t.len()];
        keep[t.tokens.iter().position(|&x| x == 12).unwrap()] = false;
        t.retain(&keep);
        assert_eq!(t.floor.iter().filter(|&&f| f).count(), 2); // follows retain
    }

    #[test]
    fn a_copy_after_a_short_match_is_priced_by_the_frequency_tree_where_it_agrees() {
        let mut t = DraftTree::default();
        t.reset(10, [NO_TOKEN, NO_TOKEN]);
        let none = TokenSet::from_ids(64, &[]);
        t.graft_chain(&[20, 21, 22], 3.0, &none, 8, NodeSource::Suffix);
        let agreed = t.push(0, 40, 0.5, NodeSource::Search);
        t.graft_chain(&[40], 2.0, &none, 8, NodeSource::Suffix); // the search's node, copied too
        assert_eq!(t.sources[agreed], NodeSource::Agreed);
        let (a, b) = (1, 2); // the chain's first two nodes
        let nodes = [(-1, 20, 0.7), (0, 21, 0.6), (-1, 40, 0.2)];
        let mut at = Vec::new();
        assert_eq!(t.graft_frequent(&nodes, 2, &none, 8, false, &mut at), 0);
        assert_eq!(t.sources[a], NodeSource::Frequent);
        assert_eq!(t.sources[b], NodeSource::Frequent);
        assert!((frequent_parts(t.scores[b]).0 - 0.6).abs() < 1e-5);
        assert_eq!(t.sources[3], NodeSource::Suffix); // past the frequency tree: still a chain
        assert_eq!(t.sources[agreed], NodeSource::FrequentAgreed);
    }

    #[test]
    fn a_frequency_score_carries_probability_and_match_class() {
        for m in [0usize, 1, 2, 3, 4, 7, 8, 100] {
            for p in [0.1f32, 0.5, 0.999, 1.0] {
                let (q, class) = frequent_parts(frequent_score(p, m));
                assert!((q - p).abs() < 1e-5, "{p} {m}: {q}");
                let want = match m {
                    0 | 1 => 0,
                    2 | 3 => 1,
                    4..=7 => 2,
                    _ => 3,
                };
                assert_eq!(class, want, "{p} {m}");
            }
        }
    }

    #[test]
    fn context_continues_into_committed_tokens() {
        let mut t = DraftTree::default();
        t.reset(10, [8, 9]);
        let a = t.push(0, 11, 0.5, NodeSource::Search);
        let b = t.push(a, 12, 0.5, NodeSource::Search);
        assert_eq!(t.context_of(0), (8, 9));
        assert_eq!(t.context_of(a), (9, 10));
        assert_eq!(t.context_of(b), (10, 11));
    }
}
