//! Every way an operator command fails, each with its exit code and a
//! one-line message (no backtraces, no multi-line dumps: scripts read the
//! exit code, people read the line).

/// Success.
pub const EXIT_OK: u8 = 0;
/// The target named nothing: no live worker with that session or hostname,
/// no placement of that id (`EXIT_NOT_FOUND`).
pub const EXIT_NOT_FOUND: u8 = 1;
/// Bad flags or arguments, or no operator token (`EX_USAGE`).
pub const EXIT_USAGE: u8 = 64;
/// pinboard refused the request as malformed, 400 (`EX_DATAERR`).
pub const EXIT_REFUSED: u8 = 65;
/// pinboard could not be reached in time, or answered 5xx (`EX_UNAVAILABLE`).
pub const EXIT_UNAVAILABLE: u8 = 69;
/// pinboard answered something this command does not understand (`EX_SOFTWARE`).
pub const EXIT_UNEXPECTED: u8 = 70;
/// pinboard refused as conflicting with the state, 409: a tray not
/// parked, a paused id, a Python owner, a newer owner (`EX_TEMPFAIL`).
pub const EXIT_CONFLICT: u8 = 75;
/// The operator token was refused, 401/403 (`EX_NOPERM`).
pub const EXIT_NO_PERMISSION: u8 = 77;

/// A failed operator command.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Bad arguments or environment.
    #[error("{0}")]
    Usage(String),
    /// The target matched nothing.
    #[error("{0}")]
    NotFound(String),
    /// pinboard answered 400 (its `detail`).
    #[error("refused: {0}")]
    Refused(String),
    /// pinboard answered 409 (its `detail`).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The token was refused.
    #[error("operator token refused ({0}): check PINBOARD_OPERATOR_TOKEN")]
    NoPermission(u16),
    /// Unreachable, timed out, or 5xx.
    #[error("{0}")]
    Unavailable(String),
    /// An answer that does not parse or an unexpected status.
    #[error("{0}")]
    Unexpected(String),
}

impl CliError {
    /// The process exit code of this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) => EXIT_USAGE,
            Self::NotFound(_) => EXIT_NOT_FOUND,
            Self::Refused(_) => EXIT_REFUSED,
            Self::Conflict(_) => EXIT_CONFLICT,
            Self::NoPermission(_) => EXIT_NO_PERMISSION,
            Self::Unavailable(_) => EXIT_UNAVAILABLE,
            Self::Unexpected(_) => EXIT_UNEXPECTED,
        }
    }
}
