//! Acceptance of a verified tree: the deepest root path whose every token equals the
//! target's prediction at its parent, plus the bonus token (the prediction at its end).

use crate::tree::DraftTree;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Acceptance {
    /// Node indices from the root (index 0) to the deepest accepted node.
    pub path: Vec<usize>,
    /// The target's prediction after the last accepted node.
    pub bonus: u32,
}

impl Acceptance {
    /// Tokens this step commits: accepted nodes after the root, then the bonus.
    pub fn committed_tokens(&self, tree: &DraftTree) -> Vec<u32> {
        let mut out: Vec<u32> = self.path[1..].iter().map(|&i| tree.tokens[i]).collect();
        out.push(self.bonus);
        out
    }
}

/// `pred[i]` is the target's argmax after node i. Ties between equally deep paths go to the
/// earliest in preorder. Parents must precede children.
pub fn accept_path(tree: &DraftTree, pred: &[u32], scratch: &mut Vec<bool>) -> Acceptance {
    let n = tree.len();
    assert_eq!(pred.len(), n, "one prediction per node");
    scratch.clear();
    scratch.resize(n, false);
    scratch[0] = true;
    let mut best = 0usize;
    for i in 1..n {
        let p = tree.parents[i] as usize;
        if scratch[p] && tree.tokens[i] == pred[p] {
            scratch[i] = true;
            if tree.depths[i] > tree.depths[best] {
                best = i;
            }
        }
    }
    Acceptance {
        path: tree.path_to(best),
        bonus: pred[best],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::{NodeSource, NO_TOKEN};
    use proptest::prelude::*;

    fn arb_case() -> impl Strategy<Value = (DraftTree, Vec<u32>)> {
        proptest::collection::vec((any::<u32>(), 0u32..3), 0..30).prop_flat_map(|spec| {
            let mut t = DraftTree::default();
            t.reset(0, [NO_TOKEN, NO_TOKEN]);
            for (i, (pick, tok)) in spec.into_iter().enumerate() {
                t.push((pick as usize) % (i + 1), tok, 0.5, NodeSource::Search);
            }
            t.into_preorder();
            let n = t.len();
            (Just(t), proptest::collection::vec(0u32..3, n))
        })
    }

    /// Naive walk: from the root, repeatedly step to the first child (in preorder) whose
    /// token equals the prediction, exploring all matching branches, keep the deepest.
    fn naive(t: &DraftTree, pred: &[u32]) -> (Vec<usize>, u32) {
        let mut best = vec![0usize];
        let mut stack = vec![vec![0usize]];
        while let Some(path) = stack.pop() {
            let last = *path.last().unwrap();
            if path.len() > best.len() || (path.len() == best.len() && last < *best.last().unwrap())
            {
                best = path.clone();
            }
            for c in 1..t.len() {
                if t.parents[c] == last as i32 && t.tokens[c] == pred[last] {
                    let mut next = path.clone();
                    next.push(c);
                    stack.push(next);
                }
            }
        }
        let end = *best.last().unwrap();
        (best, pred[end])
    }

    proptest! {
        #[test]
        fn acceptance_matches_a_naive_path_walk((tree, pred) in arb_case()) {
            let got = accept_path(&tree, &pred, &mut Vec::new());
            let (path, bonus) = naive(&tree, &pred);
            prop_assert_eq!(got.path, path);
            prop_assert_eq!(got.bonus, bonus);
        }
    }

    #[test]
    fn committed_tokens_are_the_accepted_path_then_the_bonus() {
        let mut t = DraftTree::default();
        t.reset(10, [NO_TOKEN, NO_TOKEN]);
        let a = t.push(0, 11, 0.5, NodeSource::Search);
        t.push(a, 12, 0.5, NodeSource::Search);
        t.push(0, 13, 0.5, NodeSource::Search);
        let acc = accept_path(&t, &[11, 99, 0, 0], &mut Vec::new());
        assert_eq!(acc.path, vec![0, 1]);
        assert_eq!(acc.committed_tokens(&t), vec![11, 99]);
    }
}
