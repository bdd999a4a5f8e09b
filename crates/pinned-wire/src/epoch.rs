//! Placement epochs as they travel in `Pinboard-Epoch` (wire.md §1).
//!
//! This module owns parsing the header value. It never compares or stores
//! epochs (fencing belongs to the worker's directory) and never panics on input.
//!
//! Invariant: an accepted value is one or more ASCII digits (leading zeros
//! allowed, no sign, no whitespace) that fits in a `u64`.

/// A `Pinboard-Epoch` value that is not a decimal `u64`.
///
/// Not retryable: the same header will be refused again. Its `Display` is
/// [`crate::refusal::MALFORMED_EPOCH_DETAIL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[error("malformed placement epoch")]
pub struct MalformedEpoch;

/// Parses a `Pinboard-Epoch` header value (raw header bytes).
///
/// The reference accepts any run of ASCII digits, with no upper bound. Values
/// above `u64::MAX` are refused here as malformed, a deliberate, harmless
/// deviation (no pinboard mints such epochs).
///
/// # Errors
///
/// [`MalformedEpoch`] for an empty value, any byte other than `0`..=`9`, or
/// overflow.
pub fn parse_epoch(value: &[u8]) -> Result<u64, MalformedEpoch> {
    if value.is_empty() {
        return Err(MalformedEpoch);
    }
    value.iter().try_fold(0u64, |acc, &b| {
        if !b.is_ascii_digit() {
            return Err(MalformedEpoch);
        }
        acc.checked_mul(10)
            .and_then(|acc| acc.checked_add(u64::from(b - b'0')))
            .ok_or(MalformedEpoch)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::refusal::MALFORMED_EPOCH_DETAIL;

    #[test]
    fn accepts_digits() {
        assert_eq!(parse_epoch(b"0"), Ok(0));
        assert_eq!(parse_epoch(b"007"), Ok(7));
        assert_eq!(parse_epoch(b"18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_epoch(b"000000000000000000000000001"), Ok(1));
    }

    #[test]
    fn refuses_everything_else() {
        for bad in [
            &b""[..],
            b" 1",
            b"1 ",
            b"+1",
            b"-1",
            b"1.0",
            b"0x1",
            b"1\n",
            "\u{0661}".as_bytes(),
            b"18446744073709551616",
        ] {
            assert_eq!(parse_epoch(bad), Err(MalformedEpoch), "{bad:?}");
        }
        assert_eq!(MalformedEpoch.to_string(), MALFORMED_EPOCH_DETAIL);
    }
}
