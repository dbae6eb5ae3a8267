//! Demo and benchmark backends, NOT storage: `null:SIZE` (reads zeros, discards writes) and `mem:SIZE`
//! (RAM, gone when the process exits). They let each front end be measured alone, without SRP.
//! SRP is the only real backend.

use std::sync::Mutex;

/// A backend spec that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    /// No `KIND:SIZE` form.
    #[error("'{0}': expected null:SIZE or mem:SIZE")]
    Form(String),
    /// A kind other than null or mem.
    #[error("'{0}': unknown backend; use null:SIZE or mem:SIZE (SRP targets go in --target)")]
    Kind(String),
    /// A size that does not parse.
    #[error("'{0}': expected a size such as 256M or 1G")]
    Size(String),
    /// A size the block layer cannot take.
    #[error("'{0}': the size must be a non-zero multiple of 512")]
    Unaligned(String),
}

/// Parses `null:SIZE` / `mem:SIZE` (SIZE with an optional K, M, G or T binary suffix).
pub fn parse_spec(s: &str) -> Result<(DemoKind, u64), SpecError> {
    let (kind, size) = s.split_once(':').ok_or_else(|| SpecError::Form(s.into()))?;
    let kind = match kind {
        "null" => DemoKind::Null,
        "mem" => DemoKind::Mem,
        k => return Err(SpecError::Kind(k.into())),
    };
    let size = parse_size(size).ok_or_else(|| SpecError::Size(size.into()))?;
    if size == 0 || size % 512 != 0 {
        return Err(SpecError::Unaligned(s.into()));
    }
    Ok((kind, size))
}

/// Parses a size with an optional binary suffix.
pub fn parse_size(s: &str) -> Option<u64> {
    let (num, mult) = match s.char_indices().last()? {
        (i, 'K' | 'k') => (&s[..i], 1u64 << 10),
        (i, 'M' | 'm') => (&s[..i], 1 << 20),
        (i, 'G' | 'g') => (&s[..i], 1 << 30),
        (i, 'T' | 't') => (&s[..i], 1 << 40),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

/// Which demo backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DemoKind {
    /// Reads zeros, writes discarded.
    Null,
    /// RAM.
    Mem,
}

const STRIPE: usize = 1 << 20;

/// A RAM disk shared by connections, locked in 1 MiB stripes.
pub struct MemDisk {
    size: u64,
    stripes: Vec<Mutex<Box<[u8]>>>,
}

impl MemDisk {
    /// A zeroed disk of `size` bytes.
    pub fn new(size: u64) -> Self {
        let n = (size as usize).div_ceil(STRIPE);
        let stripes = (0..n)
            .map(|i| {
                let len = STRIPE.min(size as usize - i * STRIPE);
                Mutex::new(vec![0u8; len].into_boxed_slice())
            })
            .collect();
        MemDisk { size, stripes }
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    fn each(&self, off: u64, len: usize, mut f: impl FnMut(&mut [u8], usize)) {
        let mut done = 0usize;
        while done < len {
            let pos = off as usize + done;
            let (si, so) = (pos / STRIPE, pos % STRIPE);
            let n = (STRIPE - so).min(len - done);
            if let Some(m) = self.stripes.get(si) {
                let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
                f(&mut g[so..so + n], done);
            }
            done += n;
        }
    }

    /// Reads `out.len()` bytes at `off` (the caller checked the range).
    pub fn read(&self, off: u64, out: &mut [u8]) {
        let len = out.len();
        self.each(off, len, |s, d| out[d..d + s.len()].copy_from_slice(s));
    }

    /// Writes `data` at `off` (the caller checked the range).
    pub fn write(&self, off: u64, data: &[u8]) {
        self.each(off, data.len(), |s, d| {
            s.copy_from_slice(&data[d..d + s.len()])
        });
    }

    /// Zeroes `len` bytes at `off`.
    pub fn zero(&self, off: u64, len: usize) {
        self.each(off, len, |s, _| s.fill(0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_and_sizes() {
        assert_eq!(parse_spec("mem:256M"), Ok((DemoKind::Mem, 256 << 20)));
        assert_eq!(parse_spec("null:1G"), Ok((DemoKind::Null, 1 << 30)));
        assert!(parse_spec("mem:100").is_err());
        assert!(parse_spec("disk:1G")
            .unwrap_err()
            .to_string()
            .contains("unknown backend"));
        assert!(parse_spec("mem").is_err());
        assert_eq!(parse_size("4k"), Some(4096));
        assert_eq!(parse_size("x"), None);
    }

    #[test]
    fn mem_disk_across_stripes() {
        let d = MemDisk::new(3 << 20);
        let data: Vec<u8> = (0..8192u32).map(|i| i as u8).collect();
        d.write((1 << 20) - 4096, &data);
        let mut out = vec![0u8; 8192];
        d.read((1 << 20) - 4096, &mut out);
        assert_eq!(out, data);
        d.zero((1 << 20) - 100, 200);
        d.read((1 << 20) - 4096, &mut out);
        assert!(out[3996..4196].iter().all(|&b| b == 0));
        assert_eq!(out[3995], data[3995]);
    }
}
