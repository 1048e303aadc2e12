//! Token Recycling: adjacency rows adj[t] = the target's top-k after token t, written from
//! every verified node (accepted or not) and from the prefill, kept across requests; each
//! step instantiates a static tree template from the last committed token.
//!
//! The template has the published shape (80 nodes, 8/21/25/15/8/3 per level). Within a
//! level, slots go to (parent, rank) pairs by a fixed rank prior (rank r weighs 2^-(r+1)),
//! so better-ranked branches are deeper, as in the original's hand-made template.
//!
//! Token Recycling at a chosen node budget (best-first over the same rows) is RECAP's tree
//! search with `FusionMode::Unigram` and no suffix graft; see `RecapConfig`.

use crate::drafter::{Drafter, TopKRows};
use crate::error::{Error, Result};
use crate::memory::row_stats;
use crate::shared_memory::SharedMemory;
use crate::token_set::TokenSet;
use crate::tree::{DraftTree, NodeSource};

/// Nodes per level of the published template (root not counted).
pub const TR_LEVELS: [usize; 6] = [8, 21, 25, 15, 8, 3];

/// A static tree: node i+1 hangs below template node `parent` at sibling `rank`.
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    pub slots: Vec<(u32, u32)>,
}

impl Template {
    /// Builds the template level by level from the rank prior; `width` ranks per parent.
    pub fn from_levels(levels: &[usize], width: usize) -> Self {
        let prior = |r: usize| 0.5f64.powi(r as i32 + 1);
        let mut slots = Vec::new();
        let mut score = vec![1.0f64]; // per template node, root = 0
        let mut level: Vec<usize> = vec![0];
        for &count in levels {
            let mut cands: Vec<(f64, usize, usize)> = level
                .iter()
                .flat_map(|&p| (0..width).map(move |r| (p, r)))
                .map(|(p, r)| (score[p] * prior(r), p, r))
                .collect();
            // Score desc, then parent, then rank: a rank is chosen only after its elder siblings.
            cands.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
            cands.truncate(count);
            cands.sort_by_key(|&(_, p, r)| (p, r));
            level.clear();
            for (s, p, r) in cands {
                slots.push((p as u32, r as u32));
                score.push(s);
                level.push(slots.len());
            }
        }
        Template { slots }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

pub struct TokenRecycling {
    memory: SharedMemory,
    template: Template,
    excluded: TokenSet,
    /// Tree node of each template node (usize::MAX where the branch is missing).
    placed: Vec<usize>,
}

impl TokenRecycling {
    pub fn new(memory: SharedMemory, levels: &[usize], excluded: TokenSet) -> Result<Self> {
        if levels.is_empty() || levels.iter().sum::<usize>() > 4096 {
            return Err(Error::invalid(
                "levels",
                "1 or more levels with at most 4096 nodes in all",
                format!("{levels:?}"),
            ));
        }
        let width = memory.read().k();
        Ok(TokenRecycling {
            template: Template::from_levels(levels, width),
            memory,
            excluded,
            placed: Vec::new(),
        })
    }

    pub fn template(&self) -> &Template {
        &self.template
    }

    /// Fills the template from the adjacency rows into `tree` (which holds only its root).
    pub(crate) fn fill(&mut self, tree: &mut DraftTree) {
        let adj = self.memory.read();
        self.placed.clear();
        self.placed.push(0);
        for &(parent, rank) in &self.template.slots {
            let at = self.placed[parent as usize];
            let mut node = usize::MAX;
            if at != usize::MAX {
                if let Some(row) = adj.get(tree.tokens[at]) {
                    if let (Some(&tok), Some(&p)) =
                        (row.ids.get(rank as usize), row.probs.get(rank as usize))
                    {
                        if !self.excluded.contains(tok) {
                            let score = tree.scores[at] * p;
                            node = tree.push(at, tok, score, NodeSource::Search);
                        }
                    }
                }
            }
            self.placed.push(node);
        }
    }

    pub(crate) fn write_rows<'a>(&self, rows: impl Iterator<Item = (u32, (&'a [u32], &'a [f32]))>) {
        let mut adj = self.memory.write();
        for (t, (ids, probs)) in rows {
            if !self.excluded.contains(t) {
                adj.insert(t, ids, probs, Some(row_stats(probs)));
            }
        }
    }
}

impl Drafter for TokenRecycling {
    fn name(&self) -> &'static str {
        "tr"
    }
    fn begin_request(&mut self, _context: &[u32]) {}
    fn seed(&mut self, context: &[u32], start: usize, rows: &TopKRows<'_>) {
        let n = rows.rows().min(context.len().saturating_sub(start));
        self.write_rows((0..n).map(|i| (context[start + i], rows.row(i))));
    }
    fn propose(&mut self, history: &[u32], tree: &mut DraftTree) {
        tree.start(history);
        self.fill(tree);
        tree.into_preorder();
    }
    fn max_nodes(&self) -> usize {
        self.template.len()
    }
    fn observe(&mut self, tree: &DraftTree, rows: &TopKRows<'_>, _committed: &[u32]) {
        // Reverse preorder, last write wins: the first occurrence in preorder is stored.
        self.write_rows((0..tree.len()).rev().map(|i| (tree.tokens[i], rows.row(i))));
    }
    fn parts(&self) -> Vec<(&'static str, usize)> {
        vec![
            ("persistent rows", self.memory.bytes()),
            ("excluded set", self.excluded.bytes()),
            ("template", self.placed.capacity() * 8),
        ]
    }

    fn bytes(&self) -> usize {
        self.memory.bytes() + self.excluded.bytes() + self.placed.capacity() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::NO_TOKEN;

    #[test]
    fn template_has_the_published_shape() {
        let t = Template::from_levels(&TR_LEVELS, 8);
        assert_eq!(t.len(), 80);
        let mut depth = vec![0usize];
        for &(p, _) in &t.slots {
            depth.push(depth[p as usize] + 1);
        }
        for (l, &count) in TR_LEVELS.iter().enumerate() {
            assert_eq!(depth.iter().filter(|&&d| d == l + 1).count(), count);
        }
        // Siblings take ranks 0, 1, 2, ... with no gaps.
        for parent in 0..=t.len() as u32 {
            let ranks: Vec<u32> = t
                .slots
                .iter()
                .filter(|s| s.0 == parent)
                .map(|s| s.1)
                .collect();
            assert_eq!(ranks, (0..ranks.len() as u32).collect::<Vec<_>>());
        }
    }

    #[test]
    fn fills_from_rows_and_skips_missing_branches() {
        let mem = SharedMemory::new(100, 2, 64).unwrap();
        let mut tr = TokenRecycling::new(mem, &[2, 2], TokenSet::new(100)).unwrap();
        // Root 5 -> [6, 7]; 6 -> [8, 9]; 7 has no row.
        tr.write_rows(
            [
                (5, (&[6u32, 7][..], &[0.6f32, 0.3][..])),
                (6, (&[8, 9][..], &[0.5, 0.4][..])),
            ]
            .into_iter(),
        );
        let mut tree = DraftTree::default();
        tree.reset(5, [NO_TOKEN, NO_TOKEN]);
        tr.fill(&mut tree);
        assert_eq!(tree.tokens, vec![5, 6, 7, 8, 9]);
        assert_eq!(tree.parents, vec![-1, 0, 0, 1, 1]);
        assert!((tree.scores[3] - 0.3).abs() < 1e-6);
    }
}
