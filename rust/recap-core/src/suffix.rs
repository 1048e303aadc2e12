//! Suffix automaton over the committed tokens of one request (prompt + output), appended
//! online in amortised O(1) per token, answering "longest suffix of the text that occurred
//! before, and what followed its earliest occurrence" in O(1).

/// Transitions of one state, sorted by token (most states have one or two; the initial
/// state has one per distinct token).
type Transitions = Vec<(u32, u32)>;

#[derive(Clone, Debug)]
pub struct SuffixAutomaton {
    text: Vec<u32>,
    len: Vec<u32>,
    link: Vec<u32>,
    /// Earliest end position (index into `text`) of the state's substrings.
    first_end: Vec<u32>,
    next: Vec<Transitions>,
    last: u32,
}

const NONE: u32 = u32::MAX;

/// The longest earlier occurrence of a suffix of the text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SuffixMatch {
    /// Length of the matched suffix (>= 1).
    pub len: usize,
    /// Index in the text of the token that followed the earliest earlier occurrence.
    pub continuation_start: usize,
}

impl Default for SuffixAutomaton {
    fn default() -> Self {
        Self::new()
    }
}

impl SuffixAutomaton {
    pub fn new() -> Self {
        let mut a = SuffixAutomaton {
            text: Vec::new(),
            len: Vec::new(),
            link: Vec::new(),
            first_end: Vec::new(),
            next: Vec::new(),
            last: 0,
        };
        a.clear();
        a
    }

    pub fn clear(&mut self) {
        self.text.clear();
        self.len.clear();
        self.link.clear();
        self.first_end.clear();
        self.next.clear();
        self.len.push(0);
        self.link.push(NONE);
        self.first_end.push(NONE);
        self.next.push(Vec::new());
        self.last = 0;
    }

    pub fn text(&self) -> &[u32] {
        &self.text
    }
    pub fn num_states(&self) -> usize {
        self.len.len()
    }

    #[inline]
    fn get(&self, state: u32, token: u32) -> Option<u32> {
        let t = &self.next[state as usize];
        t.binary_search_by_key(&token, |e| e.0).ok().map(|i| t[i].1)
    }

    #[inline]
    fn set(&mut self, state: u32, token: u32, target: u32) {
        let t = &mut self.next[state as usize];
        match t.binary_search_by_key(&token, |e| e.0) {
            Ok(i) => t[i].1 = target,
            Err(i) => t.insert(i, (token, target)),
        }
    }

    fn new_state(&mut self, len: u32, link: u32, first_end: u32, next: Transitions) -> u32 {
        self.len.push(len);
        self.link.push(link);
        self.first_end.push(first_end);
        self.next.push(next);
        (self.len.len() - 1) as u32
    }

    pub fn extend(&mut self, tokens: &[u32]) {
        for &t in tokens {
            self.push(t);
        }
    }

    /// Appends one token.
    pub fn push(&mut self, token: u32) {
        let pos = self.text.len() as u32;
        self.text.push(token);
        let cur = self.new_state(self.len[self.last as usize] + 1, NONE, pos, Vec::new());
        let mut p = self.last;
        while p != NONE && self.get(p, token).is_none() {
            self.set(p, token, cur);
            p = self.link[p as usize];
        }
        // The walk stops at the root's parent (NONE) or at a state with a `token` edge.
        let found = if p == NONE { None } else { self.get(p, token) };
        if let Some(q) = found {
            if self.len[p as usize] + 1 == self.len[q as usize] {
                self.link[cur as usize] = q;
            } else {
                let clone = self.new_state(
                    self.len[p as usize] + 1,
                    self.link[q as usize],
                    self.first_end[q as usize],
                    self.next[q as usize].clone(),
                );
                while p != NONE && self.get(p, token) == Some(q) {
                    self.set(p, token, clone);
                    p = self.link[p as usize];
                }
                self.link[q as usize] = clone;
                self.link[cur as usize] = clone;
            }
        } else {
            self.link[cur as usize] = 0;
        }
        self.last = cur;
    }

    /// The longest suffix of the text that also ends earlier, with the position after its
    /// earliest earlier end. None when no suffix (not even the last token) repeats.
    pub fn longest_match(&self) -> Option<SuffixMatch> {
        let s = self.link[self.last as usize];
        if s == NONE || s == 0 {
            return None;
        }
        Some(SuffixMatch {
            len: self.len[s as usize] as usize,
            continuation_start: self.first_end[s as usize] as usize + 1,
        })
    }

    /// Up to `max` tokens that followed the longest match's earliest occurrence.
    pub fn continuation(&self, max: usize) -> (&[u32], usize) {
        match self.longest_match() {
            Some(m) => {
                let end = (m.continuation_start + max).min(self.text.len());
                (&self.text[m.continuation_start..end], m.len)
            }
            None => (&[], 0),
        }
    }

    pub fn bytes(&self) -> usize {
        self.text.capacity() * 4
            + self.len.capacity() * 4
            + self.link.capacity() * 4
            + self.first_end.capacity() * 4
            + self.next.capacity() * std::mem::size_of::<Transitions>()
            + self.next.iter().map(|t| t.capacity() * 8).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Naive oracle: longest L < n with text[n-L..] occurring ending at e < n-1; earliest e.
    fn naive(text: &[u32]) -> Option<SuffixMatch> {
        let n = text.len();
        for l in (1..n).rev() {
            let suffix = &text[n - l..];
            for e in (l - 1)..(n - 1) {
                if &text[e + 1 - l..=e] == suffix {
                    return Some(SuffixMatch {
                        len: l,
                        continuation_start: e + 1,
                    });
                }
            }
        }
        None
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        #[test]
        fn matches_agree_with_naive_substring_search_after_every_append(
            text in proptest::collection::vec(0u32..4, 0..60)
        ) {
            let mut a = SuffixAutomaton::new();
            for i in 0..text.len() {
                a.push(text[i]);
                prop_assert_eq!(a.longest_match(), naive(&text[..=i]), "prefix {:?}", &text[..=i]);
            }
            prop_assert!(a.num_states() <= 2 * text.len().max(1));
        }
    }

    #[test]
    fn continuation_follows_the_earliest_occurrence() {
        let mut a = SuffixAutomaton::new();
        a.extend(&[5, 1, 2, 3, 9, 1, 2, 4, 7, 1, 2]);
        let (cont, len) = a.continuation(3);
        assert_eq!(len, 2);
        assert_eq!(cont, &[3, 9, 1]);
        a.clear();
        a.extend(&[1, 2, 3]);
        assert_eq!(a.continuation(4), (&[][..], 0));
    }
}
