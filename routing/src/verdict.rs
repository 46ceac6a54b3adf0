//! Which failures mean "this member is unwell, ask the next one" and which are the
//! answer: one table for the SDK's groups, a spoke's peers and a spoke's hubs.
//!
//! | gRPC status | verdict | why |
//! |---|---|---|
//! | `UNAVAILABLE` | unwell | down, unreachable, or (a spoke) its own upstream is |
//! | `DEADLINE_EXCEEDED` | unwell | it did not answer in time |
//! | `CANCELLED` | unwell | the connection closed under the call (a cut link, the member's own request timeout) |
//! | `UNKNOWN` | unwell | tonic's word for a transport failure mid-call (a reset) |
//! | `RESOURCE_EXHAUSTED` | unwell | it sheds load; another member has room |
//! | `INTERNAL`, `DATA_LOSS` | unwell | it failed (its disk, a bug); another member can answer |
//! | `NOT_FOUND`, `INVALID_ARGUMENT`, `OUT_OF_RANGE`, `FAILED_PRECONDITION`, `ALREADY_EXISTS` | answer | about the request or the data, the same everywhere |
//! | `ABORTED` | answer | the shard changed: every member would say so |
//! | `UNAUTHENTICATED`, `PERMISSION_DENIED` | answer | members share their grants; asking another only repeats the refusal |
//! | `UNIMPLEMENTED` | answer | the server is not a shardcache member (a misconfiguration to report, not to route around) |
//!
//! Failures without a status follow the same rule: a connection that cannot be made, and
//! bytes that fail their checksum or break the protocol (a garbled member) are unwell; a
//! version change the client saw itself is the answer (ABORTED).
//!
//! A caller may know more than the table: to a spoke asking its peers before the hub,
//! any answer but the bytes is "not here" (the hub decides), see [`Verdict::NotHere`].

/// What a failure says about the member that gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The member is unwell: pause it and ask the next one.
    Unwell,
    /// The member is well but cannot give this (a peer that does not hold a chunk): ask
    /// the next one without pausing it.
    NotHere,
    /// The answer: no other member would say otherwise.
    Answer,
}

/// The verdict of a gRPC status `code` (the table above).
pub fn of_code(code: tonic::Code) -> Verdict {
    use tonic::Code;
    match code {
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Cancelled
        | Code::Unknown
        | Code::ResourceExhausted
        | Code::Internal
        | Code::DataLoss => Verdict::Unwell,
        Code::Ok
        | Code::NotFound
        | Code::InvalidArgument
        | Code::OutOfRange
        | Code::FailedPrecondition
        | Code::AlreadyExists
        | Code::Aborted
        | Code::Unauthenticated
        | Code::PermissionDenied
        | Code::Unimplemented => Verdict::Answer,
    }
}

/// A failure a member can be judged by.
pub trait Judged {
    fn verdict(&self) -> Verdict;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_in_the_docs_is_the_code() {
        use tonic::Code::*;
        let unwell =
            [Unavailable, DeadlineExceeded, Cancelled, Unknown, ResourceExhausted, Internal, DataLoss];
        let answers = [
            Ok,
            NotFound,
            InvalidArgument,
            OutOfRange,
            FailedPrecondition,
            AlreadyExists,
            Aborted,
            Unauthenticated,
            PermissionDenied,
            Unimplemented,
        ];
        assert_eq!(unwell.len() + answers.len(), 17, "every gRPC code has a row");
        for code in unwell {
            assert_eq!(of_code(code), Verdict::Unwell, "{code:?}");
        }
        for code in answers {
            assert_eq!(of_code(code), Verdict::Answer, "{code:?}");
        }
    }
}
