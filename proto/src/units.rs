//! Byte sizes as people write them in flags: `16KiB`, `1MiB`, `64 GiB`, `1048576`.
//!
//! Binary units (KiB = 1024) as well as the decimal ones (kB = 1000), since
//! `--chunk-size 1MB` from a user who meant MiB is a common slip: `1MB` is accepted and
//! means 10^6, which is what it says.

use std::{fmt, str::FromStr};

/// How sizes are written, for `--help` footers.
pub const SIZE_SYNTAX: &str = "Sizes: 16KiB, 1.5GiB, 10G or 1048576 (bytes). K, M, G, T are KiB, MiB, GiB, TiB \
                               (10G = 10 GiB); kB, MB, GB, TB are powers of ten (10GB = 10^10 bytes).";

/// A number of bytes, parsed from `N[unit]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{input:?} is not a size; write a number with an optional unit (B, KiB, MiB, GiB, TiB, or K, M, G, T for \
     those; kB, MB, GB, TB are powers of ten), e.g. 16KiB or 1.5TiB"
)]
pub struct ParseSizeError {
    input: String,
}

const UNITS: &[(&str, u64)] = &[
    ("", 1),
    ("b", 1),
    ("kib", 1 << 10),
    ("mib", 1 << 20),
    ("gib", 1 << 30),
    ("tib", 1 << 40),
    ("k", 1 << 10),
    ("m", 1 << 20),
    ("g", 1 << 30),
    ("t", 1 << 40),
    ("kb", 1_000),
    ("mb", 1_000_000),
    ("gb", 1_000_000_000),
    ("tb", 1_000_000_000_000),
];

impl FromStr for ByteSize {
    type Err = ParseSizeError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = || ParseSizeError { input: input.to_owned() };
        let s = input.trim();
        let split = s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len());
        let (number, unit) = s.split_at(split);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() || fraction.len() > 9 || fraction.contains('.') {
            return Err(err());
        }
        let whole: u64 = whole.parse().map_err(|_| err())?;
        let unit = unit.trim().to_ascii_lowercase();
        let factor = UNITS.iter().find(|(name, _)| *name == unit).map(|(_, f)| *f).ok_or_else(err)?;
        // A fraction of the unit, in whole bytes (rounded down): 1.5TiB, 0.5GiB.
        let part = match fraction {
            "" => 0,
            digits => {
                let numerator: u128 = digits.parse().map_err(|_| err())?;
                (numerator * u128::from(factor) / 10u128.pow(digits.len() as u32)) as u64
            }
        };
        whole.checked_mul(factor).and_then(|b| b.checked_add(part)).map(ByteSize).ok_or_else(err)
    }
}

impl ByteSize {
    /// For people: the largest binary unit the size reaches, with one decimal where it
    /// is not whole (`3MiB`, `1.5GiB`, `812B`).
    pub fn human(self) -> String {
        for (name, factor) in [("TiB", 1u64 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
            if self.0 >= factor {
                return if self.0.is_multiple_of(factor) {
                    format!("{}{name}", self.0 / factor)
                } else {
                    format!("{:.1}{name}", self.0 as f64 / factor as f64)
                };
            }
        }
        format!("{}B", self.0)
    }
}

impl fmt::Display for ByteSize {
    /// The largest binary unit that divides the size exactly (`16KiB`, `1536KiB`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, factor) in [("TiB", 1u64 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
            if self.0 >= factor && self.0.is_multiple_of(factor) {
                return write!(f, "{}{name}", self.0 / factor);
            }
        }
        write!(f, "{}B", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        let p = |s: &str| s.parse::<ByteSize>().map(|b| b.0);
        assert_eq!(p("16KiB"), Ok(16384));
        assert_eq!(p("1MiB"), Ok(1 << 20));
        assert_eq!(p("64 GiB"), Ok(64 << 30));
        assert_eq!(p("1048576"), Ok(1 << 20));
        assert_eq!(p("1MB"), Ok(1_000_000));
        assert_eq!(p("2m"), Ok(2 << 20));
        assert!(p("").is_err());
        assert!(p("MiB").is_err());
        assert_eq!(p("1.5GiB"), Ok(3 << 29), "fractions of a unit");
        assert_eq!(p("1.5TiB"), Ok(3 << 39));
        assert_eq!(p("10G"), Ok(10 << 30), "G is GiB");
        assert_eq!(p("2T"), Ok(2 << 40));
        assert!(p("1.2.3GiB").is_err() && p(".5GiB").is_err());
        assert_eq!(ByteSize(3 << 20).human(), "3MiB");
        assert_eq!(ByteSize(3 << 29).human(), "1.5GiB");
        assert_eq!(ByteSize(812).human(), "812B");
        assert!(p("99999999999TiB").is_err(), "overflow is an error, not a wrap");
        assert!(p("12 parsecs").unwrap_err().to_string().contains("e.g. 16KiB"));
    }

    #[test]
    fn displays_round_trip() {
        for s in ["16KiB", "1MiB", "3GiB", "1000B"] {
            assert_eq!(s.parse::<ByteSize>().map(|b| b.to_string()).as_deref(), Ok(s));
        }
    }
}
