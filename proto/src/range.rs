//! Which byte ranges a read may ask for, checked the same way by every server.

/// Most ranges one `ReadRanges` call may carry. A training batch is 24-512 samples;
/// 4096 leaves room while bounding the work one request can ask for.
pub const MAX_RANGES_PER_CALL: usize = 4096;

/// Why a requested range was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    #[error("range at offset {offset} with length {length} ends past the end of the shard ({size} bytes)")]
    PastEnd { offset: u64, length: u64, size: u64 },
    #[error(
        "read of {requested} bytes is over this server's limit of {limit} bytes per call (--max-read); \
         split it into smaller reads, or stream it (StreamShard: Rust Client::stream_shard, Python \
         Client.stream, the CLI's get and cat)"
    )]
    TooLarge { requested: u64, limit: u64 },
    #[error("{count} ranges in one call is over the limit of {limit}; split the batch")]
    TooManyRanges { count: usize, limit: usize },
}

impl From<RangeError> for tonic::Status {
    fn from(err: RangeError) -> Self {
        tonic::Status::invalid_argument(err.to_string())
    }
}

/// `[offset, offset + length)` must lie inside a shard of `size` bytes. An empty range
/// at `offset == size` is allowed.
pub fn check_within(offset: u64, length: u64, size: u64) -> Result<(), RangeError> {
    match offset.checked_add(length) {
        Some(end) if end <= size => Ok(()),
        _ => Err(RangeError::PastEnd { offset, length, size }),
    }
}

/// The length of a read of `length` bytes at `offset` of a shard of `size` bytes asked
/// with `cut_at_end`: to the shard's end at most, and nothing from the end on.
pub fn cut_at_end(offset: u64, length: u64, size: u64) -> u64 {
    length.min(size.saturating_sub(offset))
}

/// The bytes one unary call returns must stay under the server's `--max-read`.
pub fn check_total(requested: u64, limit: u64) -> Result<(), RangeError> {
    if requested > limit { Err(RangeError::TooLarge { requested, limit }) } else { Ok(()) }
}

/// A `ReadRanges` call may carry at most [`MAX_RANGES_PER_CALL`] ranges.
pub fn check_count(count: usize) -> Result<(), RangeError> {
    if count > MAX_RANGES_PER_CALL {
        Err(RangeError::TooManyRanges { count, limit: MAX_RANGES_PER_CALL })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inside_edges_and_past_end() {
        assert!(check_within(0, 10, 10).is_ok());
        assert!(check_within(10, 0, 10).is_ok());
        assert!(check_within(0, 0, 0).is_ok());
        assert_eq!(check_within(5, 6, 10), Err(RangeError::PastEnd { offset: 5, length: 6, size: 10 }));
        assert!(check_within(11, 0, 10).is_err());
        assert!(check_within(u64::MAX, 2, 10).is_err(), "overflow must not wrap into range");
    }

    #[test]
    fn a_read_cut_at_the_end_keeps_what_lies_inside() {
        assert_eq!(cut_at_end(0, 10, 10), 10);
        assert_eq!(cut_at_end(4, 10, 10), 6);
        assert_eq!(cut_at_end(10, 10, 10), 0);
        assert_eq!(cut_at_end(12, 10, 10), 0);
        assert_eq!(cut_at_end(2, 3, 10), 3);
    }

    #[test]
    fn limits_name_the_limit() {
        let msg = check_total(17, 16).unwrap_err().to_string();
        assert!(msg.contains("limit of 16 bytes"), "{msg}");
        assert!(check_total(16, 16).is_ok());
        assert!(check_count(MAX_RANGES_PER_CALL).is_ok());
        assert!(check_count(MAX_RANGES_PER_CALL + 1).is_err());
    }
}
