//! The `Range` request header of artifact downloads (RFC 9110 §14.2;
//! docs/http-api.md "Partial downloads"): what part of a representation of
//! `total` bytes a request asks for.
//!
//! Only single byte ranges are served as `206`. A header that is not a
//! valid `bytes=` range set, or names several ranges, is ignored and the
//! whole body is sent (`200`), as RFC 9110 lets a server do.

use std::ops::Range;

use http_range_header::{EndPosition, RangeUnsatisfiableError, StartPosition};

/// What to send for a download.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeAnswer {
    /// No (usable) `Range`: the whole body, `200`.
    Whole,
    /// Bytes `start..end` (end exclusive, within the total), `206`.
    Part(Range<u64>),
    /// Nothing of a `total`-byte body is in the range: `416` with
    /// `Content-Range: bytes */total`.
    Unsatisfiable,
}

/// Resolve the `Range` header value `header` against a body of `total`
/// bytes.
pub fn resolve(header: Option<&str>, total: u64) -> RangeAnswer {
    let Some(header) = header else {
        return RangeAnswer::Whole;
    };
    let parsed = match http_range_header::parse_range_header(header) {
        Ok(p) => p,
        // `bytes=-0` asks for no byte at all.
        Err(RangeUnsatisfiableError::ZeroSuffix) => return RangeAnswer::Unsatisfiable,
        Err(_) => return RangeAnswer::Whole,
    };
    let [one] = parsed.ranges.as_slice() else {
        return RangeAnswer::Whole;
    };
    let (start, end) = match (one.start, one.end) {
        (StartPosition::Index(first), EndPosition::Index(last)) => {
            if last < first {
                // An invalid range-spec: the header is ignored.
                return RangeAnswer::Whole;
            }
            (first, last.saturating_add(1).min(total))
        }
        (StartPosition::Index(first), EndPosition::LastByte) => (first, total),
        // A suffix longer than the body is the whole body.
        (StartPosition::FromLast(n), _) => (total.saturating_sub(n), total),
    };
    if start >= total || start >= end {
        RangeAnswer::Unsatisfiable
    } else {
        RangeAnswer::Part(start..end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_ranges_resolve_to_the_bytes_rfc_9110_names() {
        assert_eq!(resolve(Some("bytes=0-99"), 1000), RangeAnswer::Part(0..100));
        assert_eq!(
            resolve(Some("bytes=100-"), 1000),
            RangeAnswer::Part(100..1000)
        );
        assert_eq!(
            resolve(Some("bytes=-50"), 1000),
            RangeAnswer::Part(950..1000)
        );
        assert_eq!(
            resolve(Some("bytes=990-2000"), 1000),
            RangeAnswer::Part(990..1000)
        );
        assert_eq!(
            resolve(Some("bytes=-5000"), 1000),
            RangeAnswer::Part(0..1000)
        );
        assert_eq!(
            resolve(Some("bytes=999-999"), 1000),
            RangeAnswer::Part(999..1000)
        );
    }

    #[test]
    fn ranges_past_the_end_are_unsatisfiable() {
        assert_eq!(
            resolve(Some("bytes=1000-"), 1000),
            RangeAnswer::Unsatisfiable
        );
        assert_eq!(
            resolve(Some("bytes=5000-6000"), 1000),
            RangeAnswer::Unsatisfiable
        );
        assert_eq!(resolve(Some("bytes=-0"), 1000), RangeAnswer::Unsatisfiable);
        assert_eq!(resolve(Some("bytes=-10"), 0), RangeAnswer::Unsatisfiable);
        assert_eq!(resolve(Some("bytes=0-0"), 0), RangeAnswer::Unsatisfiable);
    }

    #[test]
    fn absent_invalid_or_multiple_ranges_get_the_whole_body() {
        assert_eq!(resolve(None, 1000), RangeAnswer::Whole);
        assert_eq!(resolve(Some("bytes=0-9,20-29"), 1000), RangeAnswer::Whole);
        assert_eq!(resolve(Some("bytes=9-0"), 1000), RangeAnswer::Whole);
        assert_eq!(resolve(Some("items=0-9"), 1000), RangeAnswer::Whole);
        assert_eq!(resolve(Some("bytes=abc"), 1000), RangeAnswer::Whole);
    }
}
