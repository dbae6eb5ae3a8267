//! Per-queue I/O statistics for `srp-ublk stats` and monitoring: operation and byte counters, errors,
//! and a latency histogram. The queue thread keeps an [`IoCounters`] of plain integers (it is the
//! only writer) and now and then publishes it into a [`SharedIo`] of atomics, which the daemon's
//! state writer reads: nothing on the I/O path is shared or locked.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Sub-buckets per power of two of microseconds.
const SUB: usize = 4;
/// Powers of two covered: 1 us to 2^29 us (about 9 minutes); longer lands in the last bucket.
const OCTAVES: usize = 28;
/// Latency buckets.
pub const BUCKETS: usize = SUB * OCTAVES;

/// The bucket of a latency in microseconds: log-linear, 4 per power of two (at most 19% wide).
pub fn bucket(us: u64) -> usize {
    if us < SUB as u64 {
        return us as usize;
    }
    let octave = 63 - us.leading_zeros() as usize; // 2^octave <= us, octave >= 2
    let sub = ((us >> (octave - 2)) & 3) as usize; // the two bits below the top one
    (octave * SUB - SUB + sub).min(BUCKETS - 1)
}

/// The largest latency (microseconds) bucket `i` holds.
pub fn bucket_upper_us(i: usize) -> u64 {
    if i < SUB {
        return i as u64;
    }
    let (octave, sub) = (i / SUB + 1, (i % SUB) as u64);
    // bucket holds [2^octave + sub * 2^(octave-2), 2^octave + (sub+1) * 2^(octave-2))
    (1u64 << octave) + (sub + 1) * (1u64 << (octave - 2)) - 1
}

/// What an I/O was, for the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IoKind {
    /// A read.
    Read,
    /// A write.
    Write,
    /// FLUSH, DISCARD, WRITE_ZEROES.
    #[default]
    Other,
}

/// One queue's counters since it started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoCounters {
    /// Reads completed.
    pub read_ops: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Writes completed.
    pub write_ops: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Other operations completed (flush, discard, write zeroes).
    pub other_ops: u64,
    /// Operations that ended with an error.
    pub errors: u64,
    /// Sum of the latencies, microseconds.
    pub lat_sum_us: u64,
    /// Latency histogram ([`bucket`]); empty until the first I/O.
    #[serde(default)]
    pub lat: Vec<u64>,
}

impl IoCounters {
    /// Counts one completed operation of `bytes` that took `us` microseconds.
    pub fn record(&mut self, kind: IoKind, bytes: u32, ok: bool, us: u64) {
        match kind {
            IoKind::Read => {
                self.read_ops += 1;
                self.read_bytes += u64::from(bytes);
            }
            IoKind::Write => {
                self.write_ops += 1;
                self.write_bytes += u64::from(bytes);
            }
            IoKind::Other => self.other_ops += 1,
        }
        if !ok {
            self.errors += 1;
        }
        self.lat_sum_us += us;
        if self.lat.len() != BUCKETS {
            self.lat = vec![0; BUCKETS];
        }
        self.lat[bucket(us)] += 1;
    }

    /// Operations counted.
    pub fn ops(&self) -> u64 {
        self.read_ops + self.write_ops + self.other_ops
    }

    /// What happened between `before` and `self` (counters only grow; a restarted daemon's
    /// smaller counters count from zero).
    pub fn since(&self, before: &IoCounters) -> IoCounters {
        let d = |a: u64, b: u64| a.checked_sub(b).unwrap_or(a);
        let restarted = self.ops() < before.ops();
        let b = if restarted {
            &IoCounters::default()
        } else {
            before
        };
        IoCounters {
            read_ops: d(self.read_ops, b.read_ops),
            read_bytes: d(self.read_bytes, b.read_bytes),
            write_ops: d(self.write_ops, b.write_ops),
            write_bytes: d(self.write_bytes, b.write_bytes),
            other_ops: d(self.other_ops, b.other_ops),
            errors: d(self.errors, b.errors),
            lat_sum_us: d(self.lat_sum_us, b.lat_sum_us),
            lat: (0..self.lat.len())
                .map(|i| d(self.lat[i], b.lat.get(i).copied().unwrap_or(0)))
                .collect(),
        }
    }

    /// Adds `o` (another queue's) in.
    pub fn add(&mut self, o: &IoCounters) {
        self.read_ops += o.read_ops;
        self.read_bytes += o.read_bytes;
        self.write_ops += o.write_ops;
        self.write_bytes += o.write_bytes;
        self.other_ops += o.other_ops;
        self.errors += o.errors;
        self.lat_sum_us += o.lat_sum_us;
        if self.lat.len() < o.lat.len() {
            self.lat.resize(o.lat.len(), 0);
        }
        for (a, b) in self.lat.iter_mut().zip(&o.lat) {
            *a += b;
        }
    }

    /// The latency (microseconds, a bucket's upper bound) under which fraction `p` of the
    /// operations fell; `None` without operations.
    pub fn percentile(&self, p: f64) -> Option<u64> {
        let total: u64 = self.lat.iter().sum();
        if total == 0 {
            return None;
        }
        let want = ((total as f64) * p).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in self.lat.iter().enumerate() {
            seen += n;
            if seen >= want {
                return Some(bucket_upper_us(i));
            }
        }
        Some(bucket_upper_us(self.lat.len() - 1))
    }
}

/// An [`IoCounters`] in atomics: written by the queue thread ([`SharedIo::publish`]), read by the
/// state writer ([`SharedIo::snapshot`]).
#[derive(Debug)]
pub struct SharedIo {
    fields: [AtomicU64; 7],
    lat: Vec<AtomicU64>,
}

impl Default for SharedIo {
    fn default() -> Self {
        SharedIo {
            fields: Default::default(),
            lat: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl SharedIo {
    /// Copies `c` in (the queue thread, the only writer).
    pub fn publish(&self, c: &IoCounters) {
        let v = [
            c.read_ops,
            c.read_bytes,
            c.write_ops,
            c.write_bytes,
            c.other_ops,
            c.errors,
            c.lat_sum_us,
        ];
        for (a, v) in self.fields.iter().zip(v) {
            a.store(v, Relaxed);
        }
        for (a, v) in self.lat.iter().zip(&c.lat) {
            a.store(*v, Relaxed);
        }
    }

    /// What was last published.
    pub fn snapshot(&self) -> IoCounters {
        let f: Vec<u64> = self.fields.iter().map(|a| a.load(Relaxed)).collect();
        IoCounters {
            read_ops: f[0],
            read_bytes: f[1],
            write_ops: f[2],
            write_bytes: f[3],
            other_ops: f[4],
            errors: f[5],
            lat_sum_us: f[6],
            lat: self.lat.iter().map(|a| a.load(Relaxed)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ordered_and_hold_their_values() {
        let mut last = 0;
        for us in [
            0u64,
            1,
            3,
            4,
            5,
            7,
            8,
            9,
            15,
            16,
            100,
            1000,
            65_535,
            1 << 20,
            1 << 27,
        ] {
            let b = bucket(us);
            assert!(b >= last, "{us} us went back to bucket {b}");
            assert!(us <= bucket_upper_us(b), "{us} us above bucket {b}'s top");
            if b > 0 {
                assert!(
                    us > bucket_upper_us(b - 1),
                    "{us} us belongs below bucket {b}"
                );
            }
            last = b;
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        // at most 25% wide past the first few
        for i in 8..BUCKETS {
            let (lo, hi) = (bucket_upper_us(i - 1) + 1, bucket_upper_us(i));
            assert!(
                (hi - lo) as f64 <= 0.25 * lo as f64,
                "bucket {i}: {lo}..{hi}"
            );
        }
    }

    #[test]
    fn percentiles_rates_and_deltas() {
        let mut c = IoCounters::default();
        for i in 0..1000u64 {
            c.record(IoKind::Read, 4096, true, 100 + i % 10);
        }
        for _ in 0..10 {
            c.record(IoKind::Write, 65536, false, 5000);
        }
        assert_eq!((c.read_ops, c.read_bytes), (1000, 4096 * 1000));
        assert_eq!((c.write_ops, c.errors), (10, 10));
        let p50 = c.percentile(0.5).unwrap();
        assert!((100..=120).contains(&p50), "p50 {p50}");
        let p999 = c.percentile(0.999).unwrap();
        assert!((5000..=6200).contains(&p999), "p99.9 {p999}");
        let before = c.clone();
        c.record(IoKind::Read, 512, true, 1);
        let d = c.since(&before);
        assert_eq!((d.read_ops, d.read_bytes, d.write_ops), (1, 512, 0));
        assert_eq!(d.percentile(0.5), Some(1));
        assert_eq!(IoCounters::default().percentile(0.5), None);
        let shared = SharedIo::default();
        shared.publish(&c);
        assert_eq!(shared.snapshot(), c);
    }
}
