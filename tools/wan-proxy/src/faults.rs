//! What the link does besides delaying traffic, switched at run time (`WanProxy::
//! set_fault`) or cycled by a schedule (`wan-proxy --faults`): the faults a long link
//! shows, for tests and soaks. Bytes are still never changed or reordered: a fault holds
//! them, slows them, or closes the connection.

use std::time::Duration;

use tokio::sync::watch;

/// A fault of the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    /// Bytes pass after the link's delay.
    #[default]
    None,
    /// No byte moves, in either direction of any connection; new connections are
    /// accepted (and reach the upstream) but carry nothing: a hung peer, a black-holed
    /// route. Connections carry on where they stopped once the fault is cleared.
    Stall,
    /// Every connection is closed, and new ones are closed as soon as they are
    /// accepted: a peer that is down, a link that was cut, a reset.
    Down,
    /// Each direction of each connection stalls once it has delivered this many bytes
    /// (since the connection opened): a transfer that hangs midway.
    StallAfter(u64),
    /// Bytes toward one side are held (the other direction passes): requests that get
    /// no answer, or answers that never arrive.
    Hold(Toward),
    /// Each direction of each connection moves at most this many bits per second.
    Throttle(u64),
    /// Every Nth byte toward the client (answers) is flipped: bad memory, a bad NIC, a
    /// garbling middlebox. Over TLS that breaks the record (a failed connection); in
    /// plaintext the client's checksums must catch it.
    Corrupt(u64),
}

/// A direction of the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Toward {
    /// From the client to the upstream (requests).
    Upstream,
    /// From the upstream back to the client (answers).
    Client,
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::None => f.write_str("none"),
            Fault::Stall => f.write_str("stall"),
            Fault::Down => f.write_str("down"),
            Fault::StallAfter(bytes) => write!(f, "stall-after={bytes}"),
            Fault::Hold(Toward::Upstream) => f.write_str("hold-requests"),
            Fault::Hold(Toward::Client) => f.write_str("hold-answers"),
            Fault::Throttle(bps) => write!(f, "throttle={bps}bit"),
            Fault::Corrupt(every) => write!(f, "corrupt-every={every}"),
        }
    }
}

impl std::str::FromStr for Fault {
    type Err = String;

    /// `none`, `stall`, `down`, `stall-after=BYTES`, `hold-requests`, `hold-answers`,
    /// `throttle=RATE` (e.g. `throttle=20Mbit`), `corrupt-every=BYTES`.
    fn from_str(text: &str) -> Result<Self, String> {
        let (name, value) = text.split_once('=').map_or((text, None), |(n, v)| (n, Some(v)));
        match (name, value) {
            ("none", None) => Ok(Fault::None),
            ("stall", None) => Ok(Fault::Stall),
            ("down", None) => Ok(Fault::Down),
            ("hold-requests", None) => Ok(Fault::Hold(Toward::Upstream)),
            ("hold-answers", None) => Ok(Fault::Hold(Toward::Client)),
            ("stall-after", Some(bytes)) => bytes
                .parse()
                .map(Fault::StallAfter)
                .map_err(|_| format!("stall-after={bytes}: bytes as a number")),
            ("throttle", Some(rate)) => crate::parse_rate(rate).map(Fault::Throttle),
            ("corrupt-every", Some(bytes)) => bytes
                .parse()
                .ok()
                .filter(|&n| n > 0)
                .map(Fault::Corrupt)
                .ok_or_else(|| format!("corrupt-every={bytes}: a positive number of bytes")),
            _ => Err(format!(
                "unknown fault {text:?}: none, stall, down, stall-after=BYTES, hold-requests, hold-answers, \
                 throttle=RATE, corrupt-every=BYTES"
            )),
        }
    }
}

/// Faults in turn, each for its time, round and round.
pub type Schedule = Vec<(Fault, Duration)>;

/// Parses `FAULT:DURATION,...`, e.g. `none:5s,stall:2s,down:1s,throttle=20Mbit:3s`.
pub fn parse_schedule(text: &str) -> Result<Schedule, String> {
    text.split(',')
        .map(|step| {
            let (fault, time) = step
                .rsplit_once(':')
                .ok_or_else(|| format!("{step:?}: expected FAULT:DURATION, e.g. stall:2s"))?;
            let time = humantime::parse_duration(time).map_err(|e| format!("{step:?}: {e}"))?;
            Ok((fault.parse()?, time))
        })
        .collect()
}

/// Sets each fault of `schedule` in turn on `link`, round and round, until no one
/// listens. `on_change` hears each fault as it is set.
pub async fn run_schedule(link: watch::Sender<Fault>, schedule: Schedule, on_change: impl Fn(Fault)) {
    if schedule.is_empty() {
        return;
    }
    for (fault, time) in schedule.iter().cycle() {
        if link.send(*fault).is_err() {
            return;
        }
        on_change(*fault);
        tokio::time::sleep(*time).await;
    }
}

/// Waits until a piece of `len` bytes may be delivered `toward` one side, by a
/// connection direction that has delivered `written` bytes: held while a fault holds
/// it, then slowed by a throttle. Returns the fault in force (the caller garbles the
/// piece under `Corrupt`); `Err` when no one is left to change the fault.
pub(crate) async fn pass(
    faults: &mut watch::Receiver<Fault>,
    toward: Toward,
    written: u64,
    len: usize,
) -> Result<Fault, ()> {
    let held = |fault: &Fault| match *fault {
        Fault::Stall => true,
        Fault::StallAfter(bytes) => written >= bytes,
        Fault::Hold(direction) => direction == toward,
        _ => false,
    };
    let fault = match faults.wait_for(|f| !held(f)).await {
        Ok(fault) => *fault,
        Err(_) => return Err(()),
    };
    if let Fault::Throttle(bps) = fault {
        tokio::time::sleep(Duration::from_secs_f64(len as f64 * 8.0 / bps as f64)).await;
    }
    Ok(fault)
}

/// `piece`, the bytes from `written` on of one direction, with every `every`th byte of
/// the direction flipped.
pub(crate) fn corrupt(piece: bytes::Bytes, written: u64, every: u64) -> bytes::Bytes {
    let mut garbled = piece.to_vec();
    for (i, byte) in garbled.iter_mut().enumerate() {
        if (written + i as u64 + 1).is_multiple_of(every) {
            *byte ^= 0xff;
        }
    }
    garbled.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_parse_and_bad_ones_say_why() {
        let schedule = parse_schedule(
            "none:5s,stall:2s,down:1s,stall-after=65536:3s,hold-answers:1s,throttle=20Mbit:2s,corrupt-every=4:1s",
        )
        .expect("parses");
        assert_eq!(schedule.len(), 7);
        assert_eq!(schedule[6].0, Fault::Corrupt(4));
        assert_eq!(
            &corrupt(bytes::Bytes::from_static(&[0; 6]), 2, 4)[..],
            [0, 0xff, 0, 0, 0, 0xff],
            "the 4th and 8th bytes of the direction"
        );
        assert!(parse_schedule("corrupt-every=0:1s").unwrap_err().contains("positive"));
        assert_eq!(schedule[3], (Fault::StallAfter(65536), Duration::from_secs(3)));
        assert_eq!(schedule[4].0, Fault::Hold(Toward::Client));
        assert_eq!(schedule[5].0, Fault::Throttle(20_000_000));
        assert!(parse_schedule("stall").unwrap_err().contains("FAULT:DURATION"));
        assert!(parse_schedule("explode:1s").unwrap_err().contains("unknown fault"));
        for fault in schedule.iter().map(|(f, _)| *f) {
            assert_eq!(fault.to_string().parse::<Fault>(), Ok(fault));
        }
    }
}
