//! Snapshots of the persistent memory U: a versioned binary file, written atomically.
//!
//! Layout (little-endian): magic `RECAPMEM`, format version (u32), vocabulary size (u64),
//! K (u32), capacity (u64), fingerprint of the model the rows came from (u64), rows (u64),
//! clock hand (u64), evictions (u64); then per row in slot order: token (u32), width (u8),
//! second-chance mark (u8), ids (u32 x width), probabilities (f32 x width); then an FNV-1a
//! 64-bit checksum of everything before it. A file is read whole and checked before any row
//! is used: a bad file never yields half a memory.

use std::fs;
use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};
use crate::memory::UnigramTable;

pub const MAGIC: &[u8; 8] = b"RECAPMEM";
pub const VERSION: u32 = 1;
const HEADER: usize = 8 + 4 + 8 + 4 + 8 + 8 + 8 + 8 + 8;

/// What a snapshot must match to be loaded (None: anything).
#[derive(Clone, Copy, Debug, Default)]
pub struct Expect {
    pub vocab_size: Option<usize>,
    pub k: Option<usize>,
    pub fingerprint: Option<u64>,
}

/// The header fields of a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub vocab_size: usize,
    pub k: usize,
    pub capacity: usize,
    pub fingerprint: u64,
    pub rows: usize,
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn bad(what: impl Into<String>) -> Error {
    Error::Snapshot(what.into())
}

/// The snapshot bytes of `table`.
pub fn encode(table: &UnigramTable, vocab_size: usize, fingerprint: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + table.len() * (6 + 8 * table.k()) + 8);
    let (rows, hand) = table.slots();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(vocab_size as u64).to_le_bytes());
    out.extend_from_slice(&(table.k() as u32).to_le_bytes());
    out.extend_from_slice(&(table.capacity() as u64).to_le_bytes());
    out.extend_from_slice(&fingerprint.to_le_bytes());
    out.extend_from_slice(&(table.len() as u64).to_le_bytes());
    out.extend_from_slice(&(hand as u64).to_le_bytes());
    out.extend_from_slice(&table.evictions().to_le_bytes());
    for (key, ids, probs, marked) in rows {
        out.extend_from_slice(&key.to_le_bytes());
        out.push(ids.len() as u8);
        out.push(u8::from(marked));
        for id in ids {
            out.extend_from_slice(&id.to_le_bytes());
        }
        for p in probs {
            out.extend_from_slice(&p.to_le_bytes());
        }
    }
    let sum = fnv1a(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| {
            bad(format!(
                "truncated: expected {what} at byte {}, the file has {} bytes",
                self.at,
                self.bytes.len()
            ))
        })?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
}

fn usize_of(v: u64, what: &str) -> Result<usize> {
    usize::try_from(v).map_err(|_| bad(format!("{what} {v} does not fit this machine")))
}

/// The header of snapshot bytes, after the magic and version checks.
pub fn header(bytes: &[u8]) -> Result<Header> {
    let mut r = Reader { bytes, at: 0 };
    let magic = r.take(8, "the magic number")?;
    if magic != MAGIC {
        return Err(bad(format!(
            "not a recap memory snapshot: expected magic {:?}, found {:?}",
            String::from_utf8_lossy(MAGIC),
            String::from_utf8_lossy(magic)
        )));
    }
    let version = r.u32("the format version")?;
    if version != VERSION {
        return Err(bad(format!(
            "format version: expected {VERSION}, found {version}"
        )));
    }
    Ok(Header {
        vocab_size: usize_of(r.u64("the vocabulary size")?, "vocabulary size")?,
        k: r.u32("K")? as usize,
        capacity: usize_of(r.u64("the capacity")?, "capacity")?,
        fingerprint: r.u64("the fingerprint")?,
        rows: usize_of(r.u64("the row count")?, "row count")?,
    })
}

/// Checks snapshot bytes whole against `expect` and returns (header, table).
pub fn decode(bytes: &[u8], expect: Expect) -> Result<(Header, UnigramTable)> {
    let h = header(bytes)?;
    if bytes.len() < HEADER + 8 {
        return Err(bad(format!(
            "truncated: expected at least {} bytes, the file has {}",
            HEADER + 8,
            bytes.len()
        )));
    }
    let (body, tail) = bytes.split_at(bytes.len() - 8);
    let mut stored = [0u8; 8];
    stored.copy_from_slice(tail);
    let stored = u64::from_le_bytes(stored);
    let computed = fnv1a(body);
    if stored != computed {
        return Err(bad(format!(
            "checksum: expected {stored:#018x} (stored), found {computed:#018x}: the file is truncated or corrupted"
        )));
    }
    for (name, want, got) in [
        ("vocabulary size", expect.vocab_size, h.vocab_size),
        ("K", expect.k, h.k),
    ] {
        if let Some(w) = want.filter(|&w| w != got) {
            return Err(bad(format!("{name}: expected {w}, found {got}")));
        }
    }
    if let Some(w) = expect.fingerprint.filter(|&w| w != h.fingerprint) {
        return Err(bad(format!(
            "model fingerprint: expected {w:#018x}, found {:#018x} (the snapshot was made with another model or vocabulary)",
            h.fingerprint
        )));
    }
    if !(1..=255).contains(&h.k) || h.capacity == 0 || h.rows > h.capacity || h.vocab_size == 0 {
        return Err(bad(format!(
            "header: expected 1 <= K <= 255, capacity >= 1, rows <= capacity, found K {}, capacity {}, rows {}",
            h.k, h.capacity, h.rows
        )));
    }
    let mut r = Reader {
        bytes: body,
        at: HEADER - 16,
    };
    let hand = usize_of(r.u64("the clock hand")?, "clock hand")?;
    let evictions = r.u64("the eviction count")?;
    if hand >= h.capacity {
        return Err(bad(format!(
            "clock hand: expected < {}, found {hand}",
            h.capacity
        )));
    }
    let mut rows: Vec<(u32, Vec<u32>, Vec<f32>, bool)> = Vec::with_capacity(h.rows.min(1 << 20));
    let mut seen = rustc_hash::FxHashSet::default();
    for i in 0..h.rows {
        let key = r.u32("a row's token")?;
        let width = r.u8("a row's width")? as usize;
        let marked = r.u8("a row's mark")?;
        if key as usize >= h.vocab_size || width > h.k || marked > 1 || !seen.insert(key) {
            return Err(bad(format!(
                "row {i}: expected a new token < {} with at most {} entries, found token {key}, width {width}, mark {marked}",
                h.vocab_size, h.k
            )));
        }
        let mut ids = Vec::with_capacity(width);
        for _ in 0..width {
            let id = r.u32("a row's ids")?;
            if id as usize >= h.vocab_size {
                return Err(bad(format!(
                    "row {i}: token id {id} is outside the vocabulary of {}",
                    h.vocab_size
                )));
            }
            ids.push(id);
        }
        let mut probs = Vec::with_capacity(width);
        for _ in 0..width {
            let p = f32::from_bits(r.u32("a row's probabilities")?);
            if !(p.is_finite() && p >= 0.0) {
                return Err(bad(format!(
                    "row {i}: expected probabilities >= 0, found {p}"
                )));
            }
            probs.push(p);
        }
        rows.push((key, ids, probs, marked == 1));
    }
    if r.at != body.len() {
        return Err(bad(format!(
            "expected {} rows to end the file, found {} more bytes",
            h.rows,
            body.len() - r.at
        )));
    }
    let table = UnigramTable::from_slots(
        h.k,
        h.capacity,
        rows.iter()
            .map(|(k, ids, p, m)| (*k, ids.as_slice(), p.as_slice(), *m)),
        hand,
        evictions,
    );
    Ok((h, table))
}

/// Writes `bytes` to `path` atomically: a temporary file beside it, flushed to disk, then
/// renamed over it, so a crash leaves either the old snapshot or the new one.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |what: &str, e: std::io::Error| bad(format!("{what} {}: {e}", path.display()));
    let name = path
        .file_name()
        .ok_or_else(|| bad(format!("expected a file path, got {}", path.display())))?;
    let tmp = path.with_file_name(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut f =
            fs::File::create(&tmp).map_err(|e| io("cannot create a temporary file for", e))?;
        f.write_all(bytes).map_err(|e| io("cannot write", e))?;
        f.sync_all().map_err(|e| io("cannot flush", e))?;
        fs::rename(&tmp, path).map_err(|e| io("cannot replace", e))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

pub fn read(path: &Path) -> Result<Vec<u8>> {
    fs::read(path).map_err(|e| bad(format!("cannot read {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn table(rows: &[(u32, Vec<(u32, f32)>)], capacity: usize) -> UnigramTable {
        let mut t = UnigramTable::new(4, capacity);
        for (key, row) in rows {
            let ids: Vec<u32> = row.iter().map(|r| r.0).collect();
            let probs: Vec<f32> = row.iter().map(|r| r.1).collect();
            t.insert(*key, &ids, &probs, None);
        }
        t
    }

    fn same(a: &UnigramTable, b: &UnigramTable) -> bool {
        let (ra, ha) = a.slots();
        let (rb, hb) = b.slots();
        ha == hb && ra.eq(rb) && a.evictions() == b.evictions()
    }

    proptest! {
        #[test]
        fn round_trips_exactly_and_any_damage_is_refused(
            rows in proptest::collection::vec((0u32..100, proptest::collection::vec((0u32..100, 0.0f32..1.0), 0..5)), 0..40),
            cap in 1usize..16,
            flip in any::<prop::sample::Index>(),
            cut in any::<prop::sample::Index>(),
        ) {
            let t = table(&rows, cap);
            let bytes = encode(&t, 100, 7);
            let (h, back) = decode(&bytes, Expect { vocab_size: Some(100), k: Some(4), fingerprint: Some(7) }).unwrap();
            prop_assert_eq!(h.rows, t.len());
            prop_assert!(same(&t, &back));
            let mut damaged = bytes.clone();
            let i = flip.index(damaged.len());
            damaged[i] ^= 0x20;
            prop_assert!(decode(&damaged, Expect::default()).is_err());
            let n = cut.index(bytes.len());
            prop_assert!(decode(&bytes[..n], Expect::default()).is_err());
        }
    }

    #[test]
    fn mismatches_are_named() {
        let bytes = encode(&table(&[(1, vec![(2, 0.5)])], 8), 100, 7);
        let err = |e: Expect| decode(&bytes, e).unwrap_err().to_string();
        assert!(err(Expect {
            vocab_size: Some(50),
            ..Default::default()
        })
        .contains("vocabulary size: expected 50, found 100"));
        assert!(err(Expect {
            k: Some(8),
            ..Default::default()
        })
        .contains("K: expected 8, found 4"));
        assert!(err(Expect {
            fingerprint: Some(1),
            ..Default::default()
        })
        .contains("model fingerprint"));
        let mut other = bytes.clone();
        other[8] = 9;
        assert!(decode(&other, Expect::default())
            .unwrap_err()
            .to_string()
            .contains("format version: expected 1, found 9"));
        assert!(decode(b"PK\x03\x04 not ours", Expect::default())
            .unwrap_err()
            .to_string()
            .contains("not a recap memory snapshot"));
    }
}
