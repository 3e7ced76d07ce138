//! Output capture capped while streaming.
//!
//! A command may write without end; the executor keeps only the first `cap` bytes of each stream
//! and keeps reading (and counting) the rest, so the writer never blocks on a full pipe and the
//! caller learns the true size. Memory use per stream is bounded by the cap.

/// The first `cap` bytes of a stream plus the count of everything that went by.
#[derive(Debug)]
pub struct CappedBuffer {
    kept: Vec<u8>,
    cap: usize,
    total: u64,
}

impl CappedBuffer {
    /// An empty buffer keeping at most `cap` bytes.
    pub fn new(cap: usize) -> Self {
        CappedBuffer {
            kept: Vec::with_capacity(cap.min(64 * 1024)),
            cap,
            total: 0,
        }
    }

    /// Accounts for `chunk`, keeping what still fits.
    pub fn push(&mut self, chunk: &[u8]) {
        self.total += chunk.len() as u64;
        let room = self.cap - self.kept.len();
        self.kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }

    /// Total bytes seen.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Whether bytes were dropped.
    pub fn truncated(&self) -> bool {
        self.total > self.kept.len() as u64
    }

    /// The kept bytes.
    pub fn into_kept(self) -> Vec<u8> {
        self.kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_head_and_counts_the_rest() {
        let mut b = CappedBuffer::new(5);
        b.push(b"abc");
        assert!(!b.truncated());
        b.push(b"defg");
        b.push(b"hij");
        assert_eq!(b.total(), 10);
        assert!(b.truncated());
        assert_eq!(b.into_kept(), b"abcde");
    }

    #[test]
    fn exact_fit_is_not_truncated_and_zero_cap_counts_only() {
        let mut b = CappedBuffer::new(3);
        b.push(b"abc");
        assert!(!b.truncated());
        let mut z = CappedBuffer::new(0);
        z.push(&[0; 1000]);
        assert_eq!((z.total(), z.truncated()), (1000, true));
        assert!(z.into_kept().is_empty());
    }
}
