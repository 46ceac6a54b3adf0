//! The same-node door of a spoke, as the SDK uses it by itself: a spoke with a door
//! names it on every gRPC answer ([`LOCAL_DOOR_HEADER`]: its socket's path and its
//! instance). A client that can open that socket and hears the same instance from it is
//! on the spoke's node; from then on a member's reads ask the door first, and read the
//! stored pages from the files the spoke passes, each page checked against the CRC32C
//! stored in front of it before a byte of it is handed out. Where there is no door (another
//! node, a container without the socket, an older spoke, `SHARDCACHE_LOCAL_DOOR=off`),
//! or the door answers that something is not stored, the read goes over gRPC as
//! before. The files are closed when the read is done.
//!
//! The spoke's side, and what it guarantees: `spoke-cache`'s `serve/local_door.rs`.

use std::{
    fs::File,
    io::IoSliceMut,
    os::fd::OwnedFd,
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use bytes::Bytes;
use prost::Message;
use shardcache_proto::{
    LOCAL_DOOR_HEADER,
    checksum::{ChecksumMismatch, combine, crc32c},
    v1::{LocalAnswer, LocalPiece, LocalQuestion, LocalRange},
};
use shardcache_transport::local_socket::{self, MAX_ANSWER_BYTES};
use tokio::net::UnixStream;
use tonic::metadata::{Ascii, MetadataMap, MetadataValue};

use crate::{Error, Range, Result, verify::Verified};

/// Set to `off` to read over gRPC even where a spoke's door is at hand (a bench's gRPC
/// rows, a trial).
pub const DOOR_ENV: &str = "SHARDCACHE_LOCAL_DOOR";

/// How long opening a door may take: a socket on the node answers at once; one that
/// does not is not used.
const OPEN_TIMEOUT: Duration = Duration::from_secs(2);

/// A member's door, as far as its client knows it.
#[derive(Debug, Default)]
pub(crate) struct DoorSlot {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
enum State {
    /// No answer of the member named a door (yet).
    #[default]
    Unknown,
    /// Named (socket path, instance), not tried yet.
    Named(String, String),
    Open(Arc<Door>),
    /// Tried and not usable from here (or turned off): gRPC only.
    Shut,
}

impl DoorSlot {
    /// A slot that never opens a door.
    pub(crate) fn never() -> Self {
        Self { state: Mutex::new(State::Shut) }
    }

    /// Takes note of the door an answer of the member names (once; again when the member
    /// names another instance: it restarted).
    pub(crate) fn heard(&self, metadata: &MetadataMap) {
        let Some((path, instance)) =
            metadata.get(LOCAL_DOOR_HEADER).and_then(|v| v.to_str().ok()).and_then(|v| v.rsplit_once(' '))
        else {
            return;
        };
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let known = match &*state {
            State::Unknown => None,
            State::Named(_, known) => Some(known.as_str()),
            State::Open(door) => Some(door.instance.as_str()),
            State::Shut => return,
        };
        if known != Some(instance) {
            *state = if door_turned_off() {
                State::Shut
            } else {
                State::Named(path.to_owned(), instance.to_owned())
            };
        }
    }

    /// The member's door, opened on first use; `None`: read over gRPC (also for a spoke
    /// whose door takes less than one piece of a stream at a time).
    pub(crate) async fn door(&self, bearer: Option<&MetadataValue<Ascii>>) -> Option<Arc<Door>> {
        let (path, instance) = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            match std::mem::replace(&mut *state, State::Shut) {
                State::Open(door) => {
                    *state = State::Open(door.clone());
                    return Some(door);
                }
                State::Named(path, instance) => (path, instance),
                other => {
                    *state = other;
                    return None;
                }
            }
        };
        // Meanwhile the slot says Shut: concurrent reads go over gRPC, not open it again.
        let opened = tokio::time::timeout(OPEN_TIMEOUT, Door::open(path.clone(), instance, bearer)).await;
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match opened {
            Ok(Ok(door)) => {
                let door = Arc::new(door);
                *state = State::Open(door.clone());
                Some(door)
            }
            outcome => {
                let why = match outcome {
                    Ok(Err(why)) => why,
                    _ => "it did not answer in time".to_owned(),
                };
                tracing::debug!(socket = %path, %why, "the spoke's same-node door is not usable from here; reading over gRPC");
                None
            }
        }
    }

    /// The door broke under a read: gRPC from now on.
    pub(crate) fn shut(&self) {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner) = State::Shut;
    }
}

/// Whether [`DOOR_ENV`] turns the door off.
fn door_turned_off() -> bool {
    std::env::var(DOOR_ENV).is_ok_and(|v| matches!(v.trim(), "off" | "0" | "false" | "no"))
}

/// What a read through the door came to.
#[derive(Debug)]
pub(crate) enum Through {
    Read(Vec<Verified>),
    /// Something it reads is not stored (or a page failed its check): read over gRPC.
    Grpc,
    /// The door's connection failed: gRPC from now on.
    Broken,
}

/// An open door: its socket, and connections kept for the next reads.
#[derive(Debug)]
pub(crate) struct Door {
    path: PathBuf,
    instance: String,
    /// The most one call may ask for in all (the spoke's `--max-read`).
    pub(crate) max_read: u64,
    idle: Mutex<Vec<UnixStream>>,
}

impl Door {
    /// Connects to `path` and checks that it is the door of `instance`.
    async fn open(
        path: String,
        instance: String,
        bearer: Option<&MetadataValue<Ascii>>,
    ) -> Result<Door, String> {
        let stream = UnixStream::connect(&path).await.map_err(|e| format!("cannot connect: {e}"))?;
        let hello = LocalQuestion { headers: headers(&MetadataMap::new(), bearer), ranges: Vec::new() };
        let (answer, _) = ask(&stream, &hello).await.map_err(|e| format!("no hello: {e}"))?;
        if answer.spoke != instance {
            return Err(format!("the socket is spoke {:?}'s, not {instance:?}'s", answer.spoke));
        }
        if answer.code != 0 {
            return Err(format!("refused: {}", answer.message));
        }
        let max_read = answer.max_read;
        Ok(Door { path: path.into(), instance, max_read, idle: Mutex::new(vec![stream]) })
    }

    /// Reads `ranges` through the door with the call's `metadata` (its job, its token),
    /// every byte checked; `endpoint` names the member in errors.
    pub(crate) async fn read(
        &self,
        endpoint: &str,
        metadata: &MetadataMap,
        bearer: Option<&MetadataValue<Ascii>>,
        ranges: &[&Range],
    ) -> Result<Through> {
        let question = LocalQuestion {
            headers: headers(metadata, bearer),
            ranges: ranges.iter().map(|r| r.to_request()).collect(),
        };
        let idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let stream = match idle {
            Some(stream) => stream,
            None => match UnixStream::connect(&self.path).await {
                Ok(stream) => stream,
                Err(_) => return Ok(Through::Broken),
            },
        };
        let Ok((answer, files)) = ask(&stream, &question).await else { return Ok(Through::Broken) };
        self.idle.lock().unwrap_or_else(PoisonError::into_inner).push(stream);
        if answer.code != 0 {
            let status = tonic::Status::new(tonic::Code::from(answer.code as i32), answer.message);
            return Err(Error::Status { endpoint: endpoint.to_owned(), status });
        }
        if answer.not_stored {
            return Ok(Through::Grpc);
        }
        if answer.ranges.len() != ranges.len() {
            let detail = format!("{} ranges answered for {} asked", answer.ranges.len(), ranges.len());
            return Err(Error::Protocol { endpoint: endpoint.to_owned(), detail });
        }
        let files: Vec<File> = files.into_iter().map(File::from).collect();
        let door = format!("{endpoint} (same-node door {})", self.path.display());
        let asked: Vec<Range> = ranges.iter().map(|&r| r.clone()).collect();
        let total: u64 = asked.iter().map(|r| r.length).sum();
        let read = move || {
            asked
                .iter()
                .zip(answer.ranges)
                .map(|(range, answered)| read_range(&door, range, answered, &files))
                .collect::<Result<Vec<_>>>()
        };
        // Reading and checking a large call takes a while: off the runtime's threads.
        let read = if total >= BLOCKING_READ {
            tokio::task::spawn_blocking(read)
                .await
                .map_err(|e| Error::Config(format!("a read through the same-node door failed: {e}")))?
        } else {
            read()
        };
        match read {
            Ok(read) => Ok(Through::Read(read)),
            // A stored page that fails its check here is read again over gRPC: the spoke
            // finds it damaged there, and refetches it.
            Err(Error::Checksum { endpoint, source }) => {
                tracing::warn!(%endpoint, %source, "a page read through the same-node door failed its check; reading over gRPC");
                Ok(Through::Grpc)
            }
            Err(e) => Err(e),
        }
    }
}

/// Calls of at least this many bytes are read on the blocking pool (a few hundred
/// microseconds of reading and checking and more), smaller ones where they are asked.
const BLOCKING_READ: u64 = 256 << 10;

/// `range` from its answer (`answered`: pieces read from `files`, or bytes carried), checked.
fn read_range(door: &str, range: &Range, answered: LocalRange, files: &[File]) -> Result<Verified> {
    let (data, crc32c) = assemble(door, range, &answered.pieces, files)?;
    if let Some(expected) = range.expected_version.as_deref() {
        let shard = format!("{}/{}", range.dataset, range.shard);
        crate::verify::same_version(&shard, expected, &answered.version)?;
    }
    Ok(Verified { offset: range.offset, data, version: answered.version, crc32c, wire_len: 0 })
}

/// The call's headers as the door takes them: its metadata, and the token.
fn headers(
    metadata: &MetadataMap,
    bearer: Option<&MetadataValue<Ascii>>,
) -> std::collections::HashMap<String, String> {
    let mut headers: std::collections::HashMap<String, String> = metadata
        .iter()
        .filter_map(|entry| match entry {
            tonic::metadata::KeyAndValueRef::Ascii(key, value) => {
                Some((key.as_str().to_owned(), value.to_str().ok()?.to_owned()))
            }
            tonic::metadata::KeyAndValueRef::Binary(..) => None,
        })
        .collect();
    if let Some(bearer) = bearer.and_then(|b| b.to_str().ok()) {
        headers.insert("authorization".into(), bearer.to_owned());
    }
    headers
}

/// Sends `question` on `stream` and reads its answer and the files that came with it.
async fn ask(stream: &UnixStream, question: &LocalQuestion) -> std::io::Result<(LocalAnswer, Vec<OwnedFd>)> {
    local_socket::send(stream, &question.encode_to_vec(), &[]).await?;
    let (answer, files) = local_socket::recv(stream, MAX_ANSWER_BYTES)
        .await?
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
    let answer = LocalAnswer::decode(&answer[..])
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    Ok((answer, files))
}

/// The bytes of `range` from its `pieces` (pages read from `files`, or bytes carried),
/// each checked, with their CRC32C.
fn assemble(door: &str, range: &Range, pieces: &[LocalPiece], files: &[File]) -> Result<(Bytes, u32)> {
    let protocol = |detail: String| Error::Protocol { endpoint: door.to_owned(), detail };
    let mut out =
        vec![0u8; usize::try_from(range.length).map_err(|_| protocol("a range over memory".into()))?];
    let (mut at, mut crc) = (0usize, 0u32);
    let mut scratch = Vec::new();
    for piece in pieces {
        let len = if piece.page {
            (piece.to as usize).saturating_sub(piece.from as usize)
        } else {
            piece.data.len()
        };
        let Some(into) = out.get_mut(at..at + len) else {
            return Err(protocol(format!("pieces longer than the {} bytes asked", range.length)));
        };
        let offset = range.offset + at as u64;
        let part = if piece.page {
            let file = files
                .get(piece.file as usize)
                .ok_or_else(|| protocol(format!("file {} was not passed", piece.file)))?;
            let checked = read_page(file, piece, into, &mut scratch)
                .map_err(|e| protocol(format!("reading a stored page: {e}")))?;
            checked.map_err(|(expected, actual)| Error::Checksum {
                endpoint: door.to_owned(),
                source: ChecksumMismatch { offset, len, expected, actual },
            })?
        } else {
            shardcache_proto::checksum::verify(offset, &piece.data, piece.crc32c)
                .map_err(|source| Error::Checksum { endpoint: door.to_owned(), source })?;
            into.copy_from_slice(&piece.data);
            piece.crc32c
        };
        crc = combine(crc, part, len);
        at += len;
    }
    if at != out.len() {
        return Err(protocol(format!("pieces of {at} bytes for the {} asked", range.length)));
    }
    Ok((Bytes::from(out), crc))
}

/// Reads `piece`'s page from `file` and puts its part in `into`: the part's CRC32C, or
/// the page's stored and actual CRC32C when it fails its check. A whole page is read
/// straight into `into` (its header beside it); a part, with the page around it into
/// `scratch` (the check is over the whole page).
fn read_page(
    file: &File,
    piece: &LocalPiece,
    into: &mut [u8],
    scratch: &mut Vec<u8>,
) -> std::io::Result<std::result::Result<u32, (u32, u32)>> {
    let (from, to, page_len) = (piece.from as usize, piece.to as usize, piece.page_len as usize);
    if from >= to || to > page_len {
        let detail = format!("part {from}..{to} of a page of {page_len} bytes");
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, detail));
    }
    let mut header = [0u8; 4];
    if from == 0 && to == page_len {
        read_exact_at(file, &mut [IoSliceMut::new(&mut header), IoSliceMut::new(into)], piece.at)?;
        let (stored, part) = (u32::from_le_bytes(header), crc32c(into));
        return Ok(if part == stored { Ok(part) } else { Err((stored, part)) });
    }
    scratch.resize(page_len, 0);
    read_exact_at(file, &mut [IoSliceMut::new(&mut header), IoSliceMut::new(scratch)], piece.at)?;
    let (before, part, after) =
        (crc32c(&scratch[..from]), crc32c(&scratch[from..to]), crc32c(&scratch[to..]));
    let (stored, whole) =
        (u32::from_le_bytes(header), combine(combine(before, part, to - from), after, page_len - to));
    if whole != stored {
        return Ok(Err((stored, whole)));
    }
    into.copy_from_slice(&scratch[from..to]);
    Ok(Ok(part))
}

/// `preadv` until `buffers` are full: a file shorter than its place is an error.
fn read_exact_at(file: &File, buffers: &mut [IoSliceMut<'_>], mut offset: u64) -> std::io::Result<()> {
    let wanted: usize = buffers.iter().map(|b| b.len()).sum();
    let mut got = rustix::io::preadv(file, buffers, offset)?;
    offset += got as u64;
    // Rare (a regular file reads whole unless at its end): the rest one buffer at a time.
    while got < wanted {
        let mut skip = got;
        let mut done = true;
        for buffer in buffers.iter_mut() {
            if skip >= buffer.len() {
                skip -= buffer.len();
                continue;
            }
            let n = std::os::unix::fs::FileExt::read_at(file, &mut buffer[skip..], offset)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            (got, offset, done) = (got + n, offset + n as u64, false);
            break;
        }
        if done {
            break;
        }
    }
    Ok(())
}
