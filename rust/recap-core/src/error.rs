//! One error type for the whole core. Every message says what was expected and what was got.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum Error {
    /// A configuration value or argument outside its allowed range.
    #[error("{name}: expected {expected}, got {got}")]
    InvalidArgument {
        name: &'static str,
        expected: String,
        got: String,
    },
    /// A token id that does not fit the vocabulary.
    #[error(
        "{name}: token id {token} is outside the vocabulary (expected 0 <= id < {vocab_size})"
    )]
    TokenOutOfRange {
        name: &'static str,
        token: u64,
        vocab_size: usize,
    },
    /// Arrays whose lengths or shapes disagree.
    #[error("{name}: expected shape {expected}, got {got}")]
    ShapeMismatch {
        name: &'static str,
        expected: String,
        got: String,
    },
    /// An argument of the wrong kind altogether (a list where an array was expected, an
    /// array of the wrong dtype): Python's TypeError.
    #[error("{name}: expected {expected}, got {got}")]
    WrongType {
        name: &'static str,
        expected: String,
        got: String,
    },
    /// A call made in the wrong order (e.g. observe before propose).
    #[error("{0}")]
    InvalidState(String),
    /// A memory snapshot that cannot be written, read, or trusted.
    #[error("memory snapshot: {0}")]
    Snapshot(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// Fails with `TokenOutOfRange` on the first id that does not fit the vocabulary.
pub fn check_tokens(name: &'static str, ids: &[u32], vocab_size: usize) -> Result<()> {
    match ids.iter().find(|&&t| t as usize >= vocab_size) {
        Some(&bad) => Err(Error::TokenOutOfRange {
            name,
            token: bad as u64,
            vocab_size,
        }),
        None => Ok(()),
    }
}

impl Error {
    pub fn invalid(name: &'static str, expected: impl Into<String>, got: impl ToString) -> Self {
        Error::InvalidArgument {
            name,
            expected: expected.into(),
            got: got.to_string(),
        }
    }

    pub fn wrong_type(name: &'static str, expected: impl Into<String>, got: impl ToString) -> Self {
        Error::WrongType {
            name,
            expected: expected.into(),
            got: got.to_string(),
        }
    }

    pub fn shape(name: &'static str, expected: impl Into<String>, got: impl Into<String>) -> Self {
        Error::ShapeMismatch {
            name,
            expected: expected.into(),
            got: got.into(),
        }
    }
}
