//! The same-node door's framing (`shardcache.v1.LocalQuestion` / `LocalAnswer`, see
//! `proto/shardcache/v1/local.proto`): a u32 little-endian length and a message, over a
//! Unix stream socket, with file descriptors passed beside an answer (`SCM_RIGHTS`).
//!
//! Both ends use it: the spoke answers (`spoke-cache`'s `serve/local_door.rs`), the SDK
//! asks (`shardcache-client`'s `local/`). Descriptors arrive with the first bytes of
//! the answer they belong to; a reader collects every descriptor that comes while it
//! reads one message, and more than [`MAX_FILES`] (the kernel would have closed the
//! rest: `MSG_CTRUNC`) fails the read rather than hand out half an answer.

use std::{
    io::{self, IoSlice, IoSliceMut},
    mem::MaybeUninit,
    os::fd::{AsFd, BorrowedFd, OwnedFd},
};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, recvmsg, sendmsg,
};
use tokio::{io::Interest, net::UnixStream};

/// Most descriptors one answer carries: a read of 64 MiB (a spoke's largest
/// `--max-read`) in 4 MiB chunk files needs 17; the spoke never sends more than this.
pub const MAX_FILES: usize = 64;

/// Largest question a spoke reads (a `ReadRanges` batch of 10,000 ranges with long
/// names fits); a longer length prefix is refused before anything is allocated.
pub const MAX_QUESTION_BYTES: usize = 4 << 20;

/// Largest answer a reader accepts: the pieces of a 64 MiB read, and bytes carried in
/// the answer up to a read's size.
pub const MAX_ANSWER_BYTES: usize = 80 << 20;

/// Sends `message` (encoded) with its length, and `files` beside its first bytes.
pub async fn send(stream: &UnixStream, message: &[u8], files: &[BorrowedFd<'_>]) -> io::Result<()> {
    if files.len() > MAX_FILES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} files in one answer", files.len()),
        ));
    }
    let length = u32::try_from(message.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "message over 4 GiB"))?
        .to_le_bytes();
    let mut sent = 0;
    let total = length.len() + message.len();
    while sent < total {
        let (head, body) = if sent < length.len() {
            (&length[sent..], message)
        } else {
            (&[][..], &message[sent - length.len()..])
        };
        let n = stream
            .async_io(Interest::WRITABLE, || {
                let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FILES))];
                let mut control = SendAncillaryBuffer::new(&mut space);
                // The descriptors go with the first bytes only.
                if sent == 0 && !files.is_empty() {
                    control.push(SendAncillaryMessage::ScmRights(files));
                }
                let iov = [IoSlice::new(head), IoSlice::new(body)];
                Ok(sendmsg(stream.as_fd(), &iov, &mut control, SendFlags::NOSIGNAL)?)
            })
            .await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        sent += n;
    }
    Ok(())
}

/// Reads one message (at most `max` bytes) and the descriptors that came with it;
/// `None` at a clean end of the stream before a message began.
pub async fn recv(stream: &UnixStream, max: usize) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let mut files = Vec::new();
    let mut length = [0u8; 4];
    if !read_exact(stream, &mut length, &mut files, true).await? {
        return Ok(None);
    }
    let length = u32::from_le_bytes(length) as usize;
    if length > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a message of {length} bytes, over the {max} accepted"),
        ));
    }
    let mut message = vec![0u8; length];
    read_exact(stream, &mut message, &mut files, false).await?;
    Ok(Some((message, files)))
}

/// Fills `buf`, collecting descriptors into `files`; `false` when the stream ended
/// before its first byte and `may_end` (a clean close between messages).
async fn read_exact(
    stream: &UnixStream,
    buf: &mut [u8],
    files: &mut Vec<OwnedFd>,
    may_end: bool,
) -> io::Result<bool> {
    let mut filled = 0;
    while filled < buf.len() {
        let n = stream
            .async_io(Interest::READABLE, || {
                let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FILES))];
                let mut control = RecvAncillaryBuffer::new(&mut space);
                let mut iov = [IoSliceMut::new(&mut buf[filled..])];
                let got = recvmsg(stream.as_fd(), &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)?;
                for message in control.drain() {
                    if let RecvAncillaryMessage::ScmRights(fds) = message {
                        files.extend(fds);
                    }
                }
                if got.flags.contains(ReturnFlags::CTRUNC) || files.len() > MAX_FILES {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("more than {MAX_FILES} files came with one message"),
                    ));
                }
                Ok(got.bytes)
            })
            .await?;
        if n == 0 {
            if filled == 0 && may_end {
                return Ok(false);
            }
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        filled += n;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Seek, Write};

    use super::*;

    #[tokio::test]
    async fn messages_and_their_files_cross_together() {
        let (a, b) = UnixStream::pair().expect("pair");
        let mut file = tempfile::tempfile().expect("temp file");
        file.write_all(b"stored bytes").expect("write");
        send(&a, b"hello", &[file.as_fd()]).await.expect("send");
        send(&a, b"", &[]).await.expect("send empty");
        drop(a);
        let (message, files) = recv(&b, 16).await.expect("recv").expect("a message");
        assert_eq!(message, b"hello");
        assert_eq!(files.len(), 1);
        // The descriptor received is the file sent: its bytes read back.
        let mut received = std::fs::File::from(files.into_iter().next().expect("one"));
        received.rewind().expect("seek");
        let mut read = String::new();
        received.read_to_string(&mut read).expect("read");
        assert_eq!(read, "stored bytes");
        let (empty, none) = recv(&b, 16).await.expect("recv").expect("the empty message");
        assert!(empty.is_empty() && none.is_empty());
        assert!(recv(&b, 16).await.expect("clean end").is_none());
    }

    #[tokio::test]
    async fn a_length_over_the_limit_is_refused_before_reading_it() {
        let (a, b) = UnixStream::pair().expect("pair");
        send(&a, &[7u8; 100], &[]).await.expect("send");
        let err = recv(&b, 64).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("100 bytes, over the 64"), "{err}");
    }

    #[tokio::test]
    async fn a_stream_cut_inside_a_message_is_an_error_not_a_short_message() {
        let (a, b) = UnixStream::pair().expect("pair");
        let mut raw = a.into_std().expect("std");
        raw.set_nonblocking(false).expect("blocking");
        raw.write_all(&10u32.to_le_bytes()).expect("length");
        raw.write_all(b"abc").expect("part");
        drop(raw);
        assert_eq!(recv(&b, 64).await.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }
}
