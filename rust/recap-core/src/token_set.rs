//! A fixed-size bitset of token ids (excluded tokens: image placeholders, specials).

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenSet {
    words: Vec<u64>,
    count: usize,
}

impl TokenSet {
    pub fn new(vocab_size: usize) -> Self {
        TokenSet {
            words: vec![0; vocab_size.div_ceil(64)],
            count: 0,
        }
    }

    pub fn from_ids(vocab_size: usize, ids: &[u32]) -> Self {
        let mut s = Self::new(vocab_size);
        for &id in ids {
            s.insert(id);
        }
        s
    }

    /// Inserts `id`; ids beyond the set's size are ignored (they cannot occur).
    pub fn insert(&mut self, id: u32) {
        let (w, b) = ((id / 64) as usize, id % 64);
        if let Some(word) = self.words.get_mut(w) {
            if *word & (1 << b) == 0 {
                *word |= 1 << b;
                self.count += 1;
            }
        }
    }

    #[inline]
    pub fn contains(&self, id: u32) -> bool {
        let (w, b) = ((id / 64) as usize, id % 64);
        self.words.get(w).is_some_and(|word| word & (1 << b) != 0)
    }

    pub fn len(&self) -> usize {
        self.count
    }
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
    pub fn bytes(&self) -> usize {
        self.words.capacity() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn membership() {
        let s = TokenSet::from_ids(130, &[0, 63, 64, 129, 129]);
        assert!(s.contains(0) && s.contains(63) && s.contains(64) && s.contains(129));
        assert!(!s.contains(1) && !s.contains(128) && !s.contains(100_000));
        assert_eq!(s.len(), 4);
    }
}
