//! SHA-256 digests: parsing, printing and hashing files in a streaming way.

use std::fmt;
use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::HubError;

/// A SHA-256 digest (32 bytes).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sha256Digest(pub [u8; 32]);

impl Sha256Digest {
    /// Parse 64 hex digits (either case).
    pub fn from_hex(hex: &str) -> Result<Self, HubError> {
        let bad = || HubError::BadChecksum(hex.to_string());
        let b = hex.as_bytes();
        if b.len() != 64 {
            return Err(bad());
        }
        let nib = |c: u8| -> Option<u8> {
            match c {
                b'0'..=b'9' => Some(c - b'0'),
                b'a'..=b'f' => Some(c - b'a' + 10),
                b'A'..=b'F' => Some(c - b'A' + 10),
                _ => None,
            }
        };
        let mut out = [0u8; 32];
        for (i, o) in out.iter_mut().enumerate() {
            *o = (nib(b[2 * i]).ok_or_else(bad)? << 4) | nib(b[2 * i + 1]).ok_or_else(bad)?;
        }
        Ok(Self(out))
    }

    /// Lower-case hex.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Digest of a byte slice.
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }
}

impl fmt::Display for Sha256Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Sha256Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sha256Digest({})", self.to_hex())
    }
}

/// SHA-256 of everything `reader` yields, plus the byte count.
pub(crate) fn sha256_reader(
    mut reader: impl Read,
    what: &Path,
) -> Result<(Sha256Digest, u64), HubError> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20]; // [1 MiB] scratch
    let mut n = 0u64;
    loop {
        let k = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(HubError::io("read", what, e)),
        };
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((Sha256Digest(h.finalize().into()), n))
}

/// SHA-256 of a file's contents.
pub fn sha256_file(path: &Path) -> Result<Sha256Digest, HubError> {
    let f = std::fs::File::open(path).map_err(|e| HubError::io("open", path, e))?;
    Ok(sha256_reader(f, path)?.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_known_vector() {
        let d = Sha256Digest::of_bytes(b"abc");
        assert_eq!(
            d.to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            Sha256Digest::from_hex(&d.to_hex().to_uppercase()).unwrap(),
            d
        );
        assert!(Sha256Digest::from_hex("abc").is_err());
        assert!(Sha256Digest::from_hex(&"g".repeat(64)).is_err());
    }
}
