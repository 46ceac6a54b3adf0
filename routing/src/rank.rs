//! Who owns a shard: weighted rendezvous (highest-random-weight) hashing over members'
//! URLs, normalised first so that two spellings of one member rank alike.
//!
//! As AIStore places objects: every (member, dataset, shard) gets a score from a hash,
//! and the shard's members in score order are its owner, then the next to try. Anyone
//! with the same member list computes the same order, with nothing shared; a member
//! leaving moves only the shards it owned (each to its next member), a member joining
//! takes about 1/N of them. Weighted by capacity: score = weight / -ln(u), u the hash
//! mapped into (0, 1) (Schindelhauer and Schomaker's weighted rendezvous), so a member
//! with twice the weight owns twice the shards.

/// FNV-1a over the pieces, with a separator byte between them, then the splitmix64
/// finaliser: stable across builds and platforms (std's hasher is not promised to be),
/// and well mixed in every bit.
fn hash(pieces: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, piece) in pieces.iter().enumerate() {
        for &b in piece.as_bytes().iter().chain(std::iter::once(&(i as u8 ^ 0xff))) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Member `name`'s score for `dataset/shard` with `weight`.
fn score(name: &str, weight: f64, dataset: &str, shard: &str) -> f64 {
    // The top 53 bits as a float in (0, 1): never 0, never 1.
    let u = ((hash(&[name, dataset, shard]) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    weight / -u.ln()
}

/// The members (`(name, weight)`) in the order they own `dataset/shard`: the owner
/// first. Ties (equal scores) go to the earlier member.
pub fn rendezvous(members: &[(&str, f64)], dataset: &str, shard: &str) -> Vec<usize> {
    let mut scored: Vec<(f64, usize)> = members
        .iter()
        .enumerate()
        .map(|(i, &(name, weight))| (score(name, weight, dataset, shard), i))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    scored.into_iter().map(|(_, i)| i).collect()
}

/// A member's URL as it is hashed and compared: scheme and host in lower case, an IPv6
/// host in brackets (`https://fd00::1:7071`, what `https://$(POD_IP):7071` gives on an
/// IPv6 pod, is `https://[fd00::1]:7071`, what a resolver's answer gives), the port
/// always written (80 for http, 443 for https when none is given), no trailing slash.
/// Anything that is not `http://` or `https://` is returned as it is (the connection
/// refuses it with its own message).
pub fn normalize_url(url: &str) -> String {
    let url = url.trim();
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let scheme = scheme.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => "80",
        "https" => "443",
        _ => return url.to_owned(),
    };
    let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    let path = path.trim_end_matches('/');
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        // [v6] or [v6]:port
        match bracketed.split_once(']') {
            Some((host, tail)) => (host.to_owned(), tail.strip_prefix(':').unwrap_or_default().to_owned()),
            None => return url.to_owned(),
        }
    } else if authority.matches(':').count() > 1 {
        // A bare IPv6 address: the last group is the port when what is left still parses
        // as an address (fd00::1:7071), else there is no port (fd00::1).
        match authority.rsplit_once(':') {
            Some((host, port))
                if host.parse::<std::net::Ipv6Addr>().is_ok() && port.parse::<u16>().is_ok() =>
            {
                (host.to_owned(), port.to_owned())
            }
            _ => (authority.to_owned(), String::new()),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host.to_owned(), port.to_owned()),
            None => (authority.to_owned(), String::new()),
        }
    };
    let host = host.to_ascii_lowercase();
    let host = if host.contains(':') { format!("[{host}]") } else { host };
    let port = if port.is_empty() { default_port } else { port.as_str() };
    if path.is_empty() {
        format!("{scheme}://{host}:{port}")
    } else {
        format!("{scheme}://{host}:{port}/{path}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("http://spoke-{i}.spokes:7071")).collect()
    }

    fn owners(names: &[String], weights: &[f64], shards: usize) -> Vec<usize> {
        let members: Vec<(&str, f64)> =
            names.iter().map(String::as_str).zip(weights.iter().copied()).collect();
        (0..shards).map(|s| rendezvous(&members, "c4", &format!("shard-{s:05}.bin"))[0]).collect()
    }

    #[test]
    fn placement_is_stable_and_balanced_within_ten_percent() {
        let shards = 20_000;
        for n in 3..=5 {
            let names = members(n);
            let placed = owners(&names, &vec![1.0; n], shards);
            assert_eq!(placed, owners(&names, &vec![1.0; n], shards), "the same list, the same owners");
            let fair = shards as f64 / n as f64;
            for member in 0..n {
                let owned = placed.iter().filter(|&&o| o == member).count() as f64;
                assert!((owned - fair).abs() / fair < 0.10, "{n} members: member {member} owns {owned}");
            }
        }
    }

    #[test]
    fn a_change_moves_about_one_nth_and_only_to_or_from_the_changed_member() {
        let shards = 20_000;
        let four = members(4);
        let before = owners(&four, &[1.0; 4], shards);
        // Member 2 leaves: only its shards move.
        let three: Vec<String> =
            four.iter().enumerate().filter(|&(i, _)| i != 2).map(|(_, m)| m.clone()).collect();
        let after = owners(&three, &[1.0; 3], shards);
        let index_in_four = |i: usize| if i >= 2 { i + 1 } else { i };
        let moved = before.iter().zip(&after).filter(|&(&b, &a)| b != index_in_four(a)).count();
        assert!(
            before.iter().zip(&after).all(|(&b, &a)| b == 2 || b == index_in_four(a)),
            "only member 2's moved"
        );
        assert!((moved as f64 / shards as f64 - 0.25).abs() < 0.03, "{moved} moved of {shards}");
        // A fifth joins: it takes about 1/5, from everyone.
        let five = members(5);
        let joined = owners(&five, &[1.0; 5], shards);
        let taken = before.iter().zip(&joined).filter(|&(&b, &j)| b != j).count();
        assert!(
            before.iter().zip(&joined).all(|(&b, &j)| b == j || j == 4),
            "shards move only to the new member"
        );
        assert!((taken as f64 / shards as f64 - 0.20).abs() < 0.03, "{taken} moved to the new member");
    }

    #[test]
    fn weights_give_shares_in_proportion() {
        let names = members(3);
        let placed = owners(&names, &[2.0, 1.0, 1.0], 20_000);
        let share = placed.iter().filter(|&&o| o == 0).count() as f64 / 20_000.0;
        assert!((share - 0.5).abs() < 0.03, "twice the weight, half the shards of 3: {share}");
    }

    #[test]
    fn urls_are_normalised_so_one_member_has_one_spelling() {
        let same = [
            ("https://fd00::1:7071", "https://[fd00::1]:7071"),
            ("https://[FD00::1]:7071/", "https://[fd00::1]:7071"),
            ("HTTP://Spoke-0.Spokes:7071/", "http://spoke-0.spokes:7071"),
            ("http://10.0.0.7", "http://10.0.0.7:80"),
            ("https://spokes.ml.svc", "https://spokes.ml.svc:443"),
            ("https://[::1]", "https://[::1]:443"),
            ("https://fd00::1", "https://[fd00::1]:443"),
            (" http://127.0.0.1:7071 ", "http://127.0.0.1:7071"),
        ];
        for (given, normal) in same {
            assert_eq!(normalize_url(given), normal, "{given}");
            assert_eq!(normalize_url(normal), normal, "normal forms are fixed points");
        }
        assert_eq!(normalize_url("unix:/tmp/sock"), "unix:/tmp/sock", "left to the connection to refuse");
    }
}
