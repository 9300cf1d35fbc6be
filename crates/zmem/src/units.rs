//! Byte sizes: alignment, human-readable formatting and parsing of `64M`-style values.

use std::fmt;

/// Every block starts on a 256-byte boundary (what `cuMemAlloc` guarantees, and enough for any
/// vectorised load), so a block from the arena is interchangeable with one from the driver.
pub const ALIGN: u64 = 256;

/// `bytes` rounded up to [`ALIGN`]; zero-byte requests take one aligned unit so that every
/// block has a distinct address. `None` if the rounding overflows.
#[must_use]
#[inline]
pub fn align_up(bytes: u64) -> Option<u64> {
    let bytes = bytes.max(1);
    bytes.checked_add(ALIGN - 1).map(|b| b & !(ALIGN - 1))
}

/// A byte count that prints as `1.5 MiB`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut v = self.0 as f64;
        let mut u = 0;
        while v >= 1024.0 && u + 1 < UNITS.len() {
            v /= 1024.0;
            u += 1;
        }
        if u == 0 {
            write!(f, "{} B", self.0)
        } else {
            write!(f, "{v:.1} {}", UNITS[u])
        }
    }
}

/// Parses `4096`, `64K`, `64KiB`, `512M`, `2G`, `1T` (binary multiples, case-insensitive).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    if digits.is_empty() {
        return Err(format!("`{text}` does not start with a number"));
    }
    let n: u64 = digits.parse().map_err(|e| format!("`{text}`: {e}"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => {
            return Err(format!(
                "`{text}`: unknown unit `{other}` (use K, M, G or T)"
            ));
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("`{text}` overflows 64 bits"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case(0, 256)]
    #[case(1, 256)]
    #[case(255, 256)]
    #[case(256, 256)]
    #[case(257, 512)]
    #[case(48 * 1024, 48 * 1024)]
    #[case(48 * 1024 + 3, 48 * 1024 + 256)]
    fn aligns(#[case] bytes: u64, #[case] want: u64) {
        assert_eq!(align_up(bytes), Some(want));
    }

    #[test]
    fn alignment_overflow_is_none() {
        assert_eq!(align_up(u64::MAX), None);
    }

    #[rstest]
    #[case("4096", 4096)]
    #[case("64K", 64 << 10)]
    #[case("64kib", 64 << 10)]
    #[case(" 512M ", 512 << 20)]
    #[case("2G", 2 << 30)]
    #[case("1TiB", 1 << 40)]
    fn parses(#[case] text: &str, #[case] want: u64) {
        assert_eq!(parse_bytes(text), Ok(want));
    }

    #[rstest]
    #[case("")]
    #[case("M")]
    #[case("12Q")]
    #[case("99999999999T")]
    fn rejects(#[case] text: &str) {
        assert!(parse_bytes(text).is_err());
    }

    #[rstest]
    #[case(0, "0 B")]
    #[case(1023, "1023 B")]
    #[case(1536, "1.5 KiB")]
    #[case(64 << 20, "64.0 MiB")]
    fn formats(#[case] n: u64, #[case] want: &str) {
        assert_eq!(Bytes(n).to_string(), want);
    }
}
