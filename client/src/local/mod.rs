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
    os::fd::OwnedFd,
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use prost::Message;
use shardcache_proto::{
    LOCAL_DOOR_HEADER,
    v1::{LocalAnswer, LocalQuestion},
};
use shardcache_transport::local_socket::{self, MAX_ANSWER_BYTES};
use tokio::net::UnixStream;
use tonic::metadata::{Ascii, MetadataMap, MetadataValue};

mod pages;

use self::pages::read_range;
use crate::{Error, Range, Result, verify::Verified};

/// `off`: read over gRPC even where a spoke's door is at hand (a trial); `on`: use the
/// door a member names wherever its socket can be opened, even where the member's address
/// is not this machine's (a container that reaches its node's spoke at another address,
/// with the socket mounted). Default: where the member's address is this machine's.
pub const DOOR_ENV: &str = "SHARDCACHE_LOCAL_DOOR";

/// How long opening a door may take: a socket on the node answers at once; one that
/// does not is not used.
const OPEN_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a door that could not be opened (or broke) is left before it is tried again,
/// when the member names it again.
const RETRY_AFTER: Duration = Duration::from_secs(30);

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
    /// Being opened by one read (the others read over gRPC meanwhile).
    Opening(String),
    Open(Arc<Door>),
    /// Not usable from here, or broke: not tried again for this instance until `Instant`.
    Failed(String, Instant),
    /// Never (`SHARDCACHE_LOCAL_DOOR=off`, a client over a channel of its own).
    Never,
}

impl DoorSlot {
    /// A slot that never opens a door.
    pub(crate) fn never() -> Self {
        Self { state: Mutex::new(State::Never) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes note of the door an answer of the member names: tried on the next read; again
    /// when the member names another instance (it restarted), or [`RETRY_AFTER`] after
    /// it failed.
    pub(crate) fn heard(&self, metadata: &MetadataMap) {
        let Some((path, instance)) =
            metadata.get(LOCAL_DOOR_HEADER).and_then(|v| v.to_str().ok()).and_then(|v| v.rsplit_once(' '))
        else {
            return;
        };
        let mut state = self.state();
        let new = match &*state {
            State::Never => false,
            State::Unknown => true,
            State::Named(_, known) | State::Opening(known) => known != instance,
            State::Open(door) => door.instance != instance,
            State::Failed(known, until) => known != instance || Instant::now() >= *until,
        };
        if new {
            *state = match door_mode() {
                DoorMode::Off => State::Never,
                _ => State::Named(path.to_owned(), instance.to_owned()),
            };
        }
    }

    /// The member's door, opened on first use; `None`: read over gRPC. `endpoint` is the
    /// member's URL: its door is tried only where that is an address of this machine
    /// (else a process of this machine at the path the member names could pose as it),
    /// unless `SHARDCACHE_LOCAL_DOOR=on`.
    pub(crate) async fn door(
        &self,
        endpoint: &str,
        bearer: Option<&MetadataValue<Ascii>>,
    ) -> Option<Arc<Door>> {
        let (path, instance) = {
            let mut state = self.state();
            match &*state {
                State::Open(door) => return Some(door.clone()),
                State::Named(path, instance) => {
                    let named = (path.clone(), instance.clone());
                    *state = State::Opening(instance.clone());
                    named
                }
                _ => return None,
            }
        };
        // Put back as named if this read is dropped while it opens the door.
        let mut opening = Opening { slot: self, named: Some((path.clone(), instance.clone())) };
        let opened = async {
            if door_mode() != DoorMode::On && !is_this_machine(endpoint).await {
                return Err(format!("{endpoint} is not an address of this machine"));
            }
            Door::open(path.clone(), instance.clone(), bearer).await
        };
        let opened = tokio::time::timeout(OPEN_TIMEOUT, opened).await;
        opening.named = None;
        let mut state = self.state();
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
                *state = State::Failed(instance, Instant::now() + RETRY_AFTER);
                None
            }
        }
    }

    /// The door broke under a read: gRPC until the member names it again after
    /// [`RETRY_AFTER`] (or names another instance).
    pub(crate) fn shut(&self) {
        let mut state = self.state();
        if let State::Open(door) = &*state {
            *state = State::Failed(door.instance.clone(), Instant::now() + RETRY_AFTER);
        }
    }
}

/// A door being opened; put back as named if the read opening it is dropped.
struct Opening<'a> {
    slot: &'a DoorSlot,
    named: Option<(String, String)>,
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        if let Some((path, instance)) = self.named.take() {
            let mut state = self.slot.state();
            if matches!(&*state, State::Opening(known) if *known == instance) {
                *state = State::Named(path, instance);
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DoorMode {
    /// Where the member's address is this machine's (the default).
    Auto,
    /// Wherever the socket the member names can be opened (a container whose spoke has
    /// another address but whose socket is mounted).
    On,
    Off,
}

/// What [`DOOR_ENV`] says.
fn door_mode() -> DoorMode {
    match std::env::var(DOOR_ENV).as_deref().map(str::trim) {
        Ok("off" | "0" | "false" | "no") => DoorMode::Off,
        Ok("on" | "1" | "true" | "yes") => DoorMode::On,
        _ => DoorMode::Auto,
    }
}

/// Whether every address `endpoint`'s host has is one of this machine's (one a socket
/// can be bound to here).
async fn is_this_machine(endpoint: &str) -> bool {
    let Some(authority) = endpoint.split("://").nth(1).map(|rest| rest.split('/').next().unwrap_or(rest))
    else {
        return false;
    };
    let Ok(addresses) = tokio::net::lookup_host(authority).await else { return false };
    let addresses: Vec<_> = addresses.collect();
    !addresses.is_empty()
        && addresses.iter().all(|a| std::net::UdpSocket::bind(std::net::SocketAddr::new(a.ip(), 0)).is_ok())
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

    /// `question`'s answer, on a connection kept from an earlier call (or, when that one
    /// fails, the spoke having closed it meanwhile, on a new one); `None` when the door
    /// does not answer, or answers as another spoke (restarted: the member names it anew).
    async fn ask(&self, question: &LocalQuestion) -> Option<(LocalAnswer, Vec<OwnedFd>)> {
        let kept = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let answered = match kept {
            Some(stream) => ask(&stream, question).await.ok().map(|answered| (stream, answered)),
            None => None,
        };
        let (stream, (answer, files)) = match answered {
            Some(answered) => answered,
            None => {
                let stream = UnixStream::connect(&self.path).await.ok()?;
                let answered = ask(&stream, question).await.ok()?;
                (stream, answered)
            }
        };
        if answer.spoke != self.instance {
            return None;
        }
        self.idle.lock().unwrap_or_else(PoisonError::into_inner).push(stream);
        Some((answer, files))
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
        let Some((answer, files)) = self.ask(&question).await else { return Ok(Through::Broken) };
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

#[cfg(test)]
mod tests {
    use super::*;

    fn named(path: &str, instance: &str) -> MetadataMap {
        let mut metadata = MetadataMap::new();
        metadata.insert(LOCAL_DOOR_HEADER, format!("{path} {instance}").parse().unwrap());
        metadata
    }

    fn is_named(slot: &DoorSlot, instance: &str) -> bool {
        matches!(&*slot.state(), State::Named(_, known) if known == instance)
    }

    #[test]
    fn a_failed_door_is_tried_again_for_a_new_instance_or_after_a_while_and_never_when_off() {
        let slot = DoorSlot::default();
        slot.heard(&MetadataMap::new());
        assert!(matches!(&*slot.state(), State::Unknown), "an answer that names no door");
        slot.heard(&named("/run/a b/local.sock", "i1"));
        assert!(matches!(&*slot.state(), State::Named(path, _) if path == "/run/a b/local.sock"));
        *slot.state() = State::Failed("i1".into(), Instant::now() + RETRY_AFTER);
        slot.heard(&named("/run/local.sock", "i1"));
        assert!(matches!(&*slot.state(), State::Failed(..)), "the same instance, just failed: not yet");
        slot.heard(&named("/run/local.sock", "i2"));
        assert!(is_named(&slot, "i2"), "a restarted spoke is tried at once");
        *slot.state() = State::Failed("i2".into(), Instant::now());
        slot.heard(&named("/run/local.sock", "i2"));
        assert!(is_named(&slot, "i2"), "after a while, tried again");
        let never = DoorSlot::never();
        never.heard(&named("/run/local.sock", "i3"));
        assert!(matches!(&*never.state(), State::Never));
    }

    #[tokio::test]
    async fn a_door_is_tried_only_where_the_members_address_is_this_machines() {
        assert!(is_this_machine("http://127.0.0.1:7071").await);
        assert!(is_this_machine("https://localhost:7071/").await);
        // TEST-NET-1 (RFC 5737): no machine's address.
        assert!(!is_this_machine("http://192.0.2.1:7071").await);
        assert!(!is_this_machine("not a url").await);
    }

    #[tokio::test]
    async fn a_read_dropped_while_it_opens_the_door_leaves_it_to_be_opened() {
        use futures::FutureExt;
        let slot = DoorSlot::default();
        slot.heard(&named("/nonexistent/local.sock", "i1"));
        // Polled once and dropped while it looks the member's name up (a hedge or a
        // timeout that ends the read): the next read opens it.
        assert!(slot.door("http://localhost:1", None).now_or_never().is_none());
        assert!(is_named(&slot, "i1"), "{:?}", slot.state());
        // Opened to the end: a socket that is not there fails, and is not tried at once again.
        assert!(slot.door("http://localhost:1", None).await.is_none());
        assert!(matches!(&*slot.state(), State::Failed(known, _) if known == "i1"), "{:?}", slot.state());
    }
}
