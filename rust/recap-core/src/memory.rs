//! Memory tables of top-K rows: U (token -> row, persists across requests) and the
//! request-local C ((prev, tok) -> row) and G ((prev2, prev, tok) -> row).
//!
//! A row holds the target's top-K continuation of one context: up to K token ids sorted by
//! probability (descending) and their full-softmax probabilities. When a row is written we
//! also store `1 / sum(probs)` (to normalise within the row) and `exp(-H)` of the normalised
//! row, the confidence that fusion weighs it by, so lookups do no transcendental math.
//!
//! Every table is bounded by a row capacity. **Eviction rule (CLOCK / second chance):** slots
//! are reused in a ring; a row rewritten since the clock hand last passed it is spared once
//! (its mark is cleared), the first unmarked row under the hand is evicted. Rewriting an
//! existing key never evicts anything. Last write wins for a key.

use rustc_hash::FxHashMap;
use std::hash::Hash;

/// A borrowed row: ids and raw probabilities, with the precomputed normaliser and confidence.
#[derive(Clone, Copy, Debug)]
pub struct RowView<'a> {
    pub ids: &'a [u32],
    pub probs: &'a [f32],
    /// 1 / sum(probs); multiply a raw probability by it to normalise within the row.
    pub inv_mass: f32,
    /// exp(-H) of the normalised row, in (0, 1].
    pub confidence: f32,
}

/// Entropy-confidence and inverse mass of a row of raw probabilities.
pub fn row_stats(probs: &[f32]) -> (f32, f32) {
    let mass: f32 = probs.iter().sum();
    if mass <= 0.0 || !mass.is_finite() {
        return (0.0, 0.0);
    }
    let inv = 1.0 / mass;
    let mut h = 0.0f32;
    for &p in probs {
        let q = p * inv;
        if q > 0.0 {
            h -= q * q.ln();
        }
    }
    (inv, (-h).exp())
}

/// One slot of a table as a snapshot sees it: (key, ids, probs, second-chance mark).
pub type SlotRow<'a, Key> = (Key, &'a [u32], &'a [f32], bool);

/// A bounded key -> top-K row table with CLOCK eviction.
#[derive(Clone, Debug)]
pub struct RowTable<Key> {
    k: usize,
    capacity: usize,
    index: FxHashMap<Key, u32>,
    keys: Vec<Key>,
    ids: Vec<u32>,
    probs: Vec<f32>,
    lens: Vec<u8>,
    inv_mass: Vec<f32>,
    confidence: Vec<f32>,
    marked: Vec<bool>,
    hand: usize,
    evictions: u64,
}

impl<Key: Copy + Eq + Hash> RowTable<Key> {
    /// `k`: entries per row (1..=255). `capacity`: maximum number of rows (>= 1).
    pub fn new(k: usize, capacity: usize) -> Self {
        assert!((1..=255).contains(&k), "row width must be 1..=255");
        assert!(capacity >= 1, "capacity must be >= 1");
        RowTable {
            k,
            capacity,
            index: FxHashMap::default(),
            keys: Vec::new(),
            ids: Vec::new(),
            probs: Vec::new(),
            lens: Vec::new(),
            inv_mass: Vec::new(),
            confidence: Vec::new(),
            marked: Vec::new(),
            hand: 0,
            evictions: 0,
        }
    }

    pub fn k(&self) -> usize {
        self.k
    }
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    pub fn len(&self) -> usize {
        self.keys.len()
    }
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
    /// Rows evicted since creation (not reset by `clear`).
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Drops every row but keeps the allocations for the next request.
    pub fn clear(&mut self) {
        self.index.clear();
        self.keys.clear();
        self.ids.clear();
        self.probs.clear();
        self.lens.clear();
        self.inv_mass.clear();
        self.confidence.clear();
        self.marked.clear();
        self.hand = 0;
    }

    #[inline]
    pub fn get(&self, key: Key) -> Option<RowView<'_>> {
        let slot = *self.index.get(&key)? as usize;
        let len = self.lens[slot] as usize;
        let base = slot * self.k;
        Some(RowView {
            ids: &self.ids[base..base + len],
            probs: &self.probs[base..base + len],
            inv_mass: self.inv_mass[slot],
            confidence: self.confidence[slot],
        })
    }

    /// Writes a row (at most `k` entries are kept; ids/probs must have equal length).
    /// `stats` is `row_stats(probs)` when the caller already has it.
    pub fn insert(&mut self, key: Key, ids: &[u32], probs: &[f32], stats: Option<(f32, f32)>) {
        debug_assert_eq!(ids.len(), probs.len());
        let len = ids.len().min(self.k);
        let (inv_mass, confidence) = stats.unwrap_or_else(|| row_stats(&probs[..len]));
        let slot = match self.index.get(&key) {
            Some(&s) => s as usize,
            None => self.allocate_slot(key),
        };
        let base = slot * self.k;
        self.ids[base..base + len].copy_from_slice(&ids[..len]);
        self.probs[base..base + len].copy_from_slice(&probs[..len]);
        self.lens[slot] = len as u8;
        self.inv_mass[slot] = inv_mass;
        self.confidence[slot] = confidence;
        self.marked[slot] = true;
    }

    fn allocate_slot(&mut self, key: Key) -> usize {
        if self.keys.len() < self.capacity {
            let slot = self.keys.len();
            if slot == self.keys.capacity() {
                // Grow by doubling but never past the row capacity, so a full table holds no slack.
                let extra = slot.max(16).min(self.capacity - slot);
                self.keys.reserve_exact(extra);
                self.ids.reserve_exact(extra * self.k);
                self.probs.reserve_exact(extra * self.k);
                self.lens.reserve_exact(extra);
                self.inv_mass.reserve_exact(extra);
                self.confidence.reserve_exact(extra);
                self.marked.reserve_exact(extra);
                self.index.reserve(extra);
            }
            self.keys.push(key);
            self.ids.resize(self.ids.len() + self.k, 0);
            self.probs.resize(self.probs.len() + self.k, 0.0);
            self.lens.push(0);
            self.inv_mass.push(0.0);
            self.confidence.push(0.0);
            self.marked.push(false);
            self.index.insert(key, slot as u32);
            return slot;
        }
        // CLOCK: spare marked rows once, evict the first unmarked one under the hand.
        loop {
            let slot = self.hand;
            self.hand = (self.hand + 1) % self.capacity;
            if self.marked[slot] {
                self.marked[slot] = false;
            } else {
                self.index.remove(&self.keys[slot]);
                self.keys[slot] = key;
                self.index.insert(key, slot as u32);
                self.evictions += 1;
                return slot;
            }
        }
    }

    /// Every row in slot order as (key, ids, probs, marked), with the clock hand: what a
    /// snapshot stores to restore the table exactly (eviction order included).
    pub fn slots(&self) -> (impl Iterator<Item = SlotRow<'_, Key>> + '_, usize) {
        let rows = (0..self.keys.len()).map(move |s| {
            let base = s * self.k;
            let len = self.lens[s] as usize;
            (
                self.keys[s],
                &self.ids[base..base + len],
                &self.probs[base..base + len],
                self.marked[s],
            )
        });
        (rows, self.hand)
    }

    /// Rebuilds a table from `slots()` output (keys distinct, rows at most `k` wide, at most
    /// `capacity` rows, the hand inside the table; the caller checks).
    pub fn from_slots<'a>(
        k: usize,
        capacity: usize,
        rows: impl Iterator<Item = SlotRow<'a, Key>>,
        hand: usize,
        evictions: u64,
    ) -> Self {
        let mut t = RowTable::new(k, capacity);
        for (key, ids, probs, marked) in rows {
            let slot = t.allocate_slot(key);
            let base = slot * k;
            let len = ids.len().min(k);
            t.ids[base..base + len].copy_from_slice(&ids[..len]);
            t.probs[base..base + len].copy_from_slice(&probs[..len]);
            t.lens[slot] = len as u8;
            let (inv, conf) = row_stats(&probs[..len]);
            t.inv_mass[slot] = inv;
            t.confidence[slot] = conf;
            t.marked[slot] = marked;
        }
        t.hand = hand;
        t.evictions = evictions;
        t
    }

    /// Heap bytes held by this table (row storage plus an estimate of the hash index).
    pub fn bytes(&self) -> usize {
        use std::mem::size_of;
        let buckets = if self.index.capacity() == 0 {
            0
        } else {
            (self.index.capacity() * 8 / 7).next_power_of_two()
        };
        buckets * (size_of::<(Key, u32)>() + 1)
            + self.keys.capacity() * size_of::<Key>()
            + self.ids.capacity() * 4
            + self.probs.capacity() * 4
            + self.lens.capacity()
            + self.inv_mass.capacity() * 4
            + self.confidence.capacity() * 4
            + self.marked.capacity()
    }
}

/// Packs context keys for C and G. Token ids need at most 21 bits (vocabularies up to
/// 2,097,152), so three ids fit one u64.
pub const MAX_VOCAB: usize = 1 << 21;

#[inline]
pub fn key_c(prev: u32, tok: u32) -> u64 {
    ((prev as u64) << 21) | tok as u64
}

#[inline]
pub fn key_g(prev2: u32, prev: u32, tok: u32) -> u64 {
    ((prev2 as u64) << 42) | ((prev as u64) << 21) | tok as u64
}

/// The persistent unigram table U.
pub type UnigramTable = RowTable<u32>;

/// The request-local tables C and G, cleared when a request starts.
#[derive(Clone, Debug)]
pub struct ContextTables {
    pub c: RowTable<u64>,
    pub g: RowTable<u64>,
}

impl ContextTables {
    pub fn new(k: usize, capacity: usize) -> Self {
        ContextTables {
            c: RowTable::new(k, capacity),
            g: RowTable::new(k, capacity),
        }
    }
    pub fn clear(&mut self) {
        self.c.clear();
        self.g.clear();
    }
    pub fn bytes(&self) -> usize {
        self.c.bytes() + self.g.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_write_wins_and_rows_truncate_to_k() {
        let mut t: RowTable<u32> = RowTable::new(2, 4);
        t.insert(7, &[1, 2, 3], &[0.5, 0.3, 0.2], None);
        t.insert(7, &[4, 5], &[0.6, 0.4], None);
        let r = t.get(7).unwrap();
        assert_eq!(r.ids, &[4, 5]);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn capacity_is_never_exceeded_and_marked_rows_get_a_second_chance() {
        let mut t: RowTable<u32> = RowTable::new(1, 3);
        for key in 0..3 {
            t.insert(key, &[key], &[1.0], None);
        }
        // All three are marked; the hand clears marks then evicts slot 0 (key 0).
        t.insert(10, &[10], &[1.0], None);
        assert!(t.get(0).is_none());
        assert_eq!(t.len(), 3);
        // Rewrite key 1 so it is marked again; key 2 is unmarked and goes next.
        t.insert(1, &[1], &[1.0], None);
        t.insert(11, &[11], &[1.0], None);
        assert!(t.get(1).is_some());
        assert!(t.get(2).is_none());
        assert_eq!(t.evictions(), 2);
    }

    #[test]
    fn confidence_is_one_for_a_point_mass_and_lower_for_spread_rows() {
        let (inv, conf) = row_stats(&[0.5]);
        assert!((inv - 2.0).abs() < 1e-6);
        assert!((conf - 1.0).abs() < 1e-6);
        let (_, conf2) = row_stats(&[0.25, 0.25]);
        assert!((conf2 - 0.5).abs() < 1e-6);
    }

    #[test]
    fn context_keys_do_not_collide_across_positions() {
        assert_ne!(key_c(1, 2), key_c(2, 1));
        assert_ne!(key_g(1, 2, 3), key_g(3, 2, 1));
        assert_ne!(key_g(0, 1, 2), key_c(1, 2) | (1u64 << 63));
    }
}

#[cfg(test)]
mod bound_tests {
    use super::*;

    #[test]
    fn a_full_table_holds_no_growth_slack() {
        let mut t: RowTable<u32> = RowTable::new(8, 1000);
        for key in 0..5000u32 {
            t.insert(key, &[key; 8], &[0.1; 8], None);
        }
        assert_eq!(t.len(), 1000);
        // Row storage is exactly capacity * k; the index estimate stays within its buckets.
        let rows = 1000 * (8 * 4 + 8 * 4 + 4 + 1 + 4 + 4 + 1);
        assert!(
            t.bytes() >= rows && t.bytes() < rows + 2048 * 9 + 4096,
            "{}",
            t.bytes()
        );
    }
}
