//! The memory that outlives a request: RECAP's persistent unigram table U (and Token
//! Recycling's adjacency rows), shared behind `Arc` by every session that drafts from it,
//! plus the checks every drafter applies to it (vocabulary, row width K).

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::error::{Error, Result};
use crate::memory::{UnigramTable, MAX_VOCAB};
use crate::snapshot;

/// The widest memory row (and proposal) any drafter takes: one bound for K everywhere.
pub const MAX_K: usize = 64;

/// The persistent unigram memory U, shareable between drafters (and threads). Behind a
/// read-write lock: sessions search it under a shared read lock, so concurrent requests
/// draft in parallel, and only their writes (seeding, observing a verified tree) take turns.
#[derive(Clone, Debug)]
pub struct SharedMemory {
    vocab_size: usize,
    table: Arc<RwLock<UnigramTable>>,
}

impl SharedMemory {
    pub const DEFAULT_CAPACITY: usize = 49_152;

    pub fn new(vocab_size: usize, k: usize, capacity: usize) -> Result<Self> {
        check_vocab(vocab_size)?;
        check_k(k)?;
        if capacity == 0 {
            return Err(Error::invalid("capacity", ">= 1", 0));
        }
        Ok(SharedMemory {
            vocab_size,
            table: Arc::new(RwLock::new(UnigramTable::new(k, capacity))),
        })
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Reads U (shared with other readers); a poisoned lock (a panic elsewhere) still yields
    /// the table.
    pub fn read(&self) -> RwLockReadGuard<'_, UnigramTable> {
        self.table.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes U (alone).
    pub fn write(&self) -> RwLockWriteGuard<'_, UnigramTable> {
        self.table.write().unwrap_or_else(|e| e.into_inner())
    }

    pub fn bytes(&self) -> usize {
        self.read().bytes()
    }

    /// `Ok` when this memory fits a drafter of `vocab_size` and row width `k`.
    pub fn check_fits(&self, vocab_size: usize, k: usize) -> Result<()> {
        let got_k = self.read().k();
        if self.vocab_size != vocab_size || got_k != k {
            return Err(Error::invalid(
                "memory",
                format!("a memory with vocab_size {vocab_size} and k {k}"),
                format!("vocab_size {} and k {got_k}", self.vocab_size),
            ));
        }
        Ok(())
    }

    /// Writes a snapshot to `path` atomically (see `snapshot`).
    pub fn save(&self, path: &std::path::Path, fingerprint: u64) -> Result<()> {
        let bytes = snapshot::encode(&self.read(), self.vocab_size, fingerprint);
        snapshot::write_atomic(path, &bytes)
    }

    /// A memory read from a snapshot, checked whole against `expect`.
    pub fn load(
        path: &std::path::Path,
        expect: snapshot::Expect,
    ) -> Result<(Self, snapshot::Header)> {
        let bytes = snapshot::read(path)?;
        let (header, table) = snapshot::decode(&bytes, expect)?;
        check_vocab(header.vocab_size)?;
        Ok((
            SharedMemory {
                vocab_size: header.vocab_size,
                table: Arc::new(RwLock::new(table)),
            },
            header,
        ))
    }
}

pub fn check_vocab(vocab_size: usize) -> Result<()> {
    if !(1..=MAX_VOCAB).contains(&vocab_size) {
        return Err(Error::invalid(
            "vocab_size",
            format!("1..={MAX_VOCAB}"),
            vocab_size,
        ));
    }
    Ok(())
}

/// `Ok` for a row width K in 1..=MAX_K.
pub fn check_k(k: usize) -> Result<()> {
    if !(1..=MAX_K).contains(&k) {
        return Err(Error::invalid("k", format!("1..={MAX_K}"), k));
    }
    Ok(())
}
