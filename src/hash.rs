//! Stable hashes: the same bytes give the same value in every process, version and machine (cache keys that
//! persist on disk, weight and index fingerprints compared across replicas).

/// 64-bit FNV-1a.
pub struct Fnv(pub u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    pub fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    /// The hash in hex (16 digits).
    pub fn hex(&self) -> String {
        format!("{:016x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn fnv1a64_known_values() {
        let hash = |s: &str| {
            let mut h = super::Fnv::default();
            h.write(s.as_bytes());
            h.hex()
        };
        assert_eq!(hash(""), "cbf29ce484222325");
        assert_eq!(hash("a"), "af63dc4c8601ec8c");
    }
}
