//! Lazily materialised bytes of one allocation.
//!
//! Storage is kept in 64 KiB pages created on first write, so a large reservation (an arena of
//! a gigabyte) costs host memory only where it is written. Untouched bytes read as `fill`.

use std::collections::HashMap;

const PAGE: usize = 64 * 1024;

#[derive(Debug)]
pub(crate) struct Storage {
    fill: u8,
    pages: HashMap<usize, Box<[u8]>>,
}

impl Storage {
    /// Storage whose every byte reads as `fill` until written.
    pub(crate) fn new(fill: u8) -> Self {
        Storage {
            fill,
            pages: HashMap::new(),
        }
    }

    /// Forgets every write: all bytes read as `fill` again (poisoning without touching memory).
    pub(crate) fn reset(&mut self, fill: u8) {
        self.fill = fill;
        self.pages.clear();
    }

    /// Copies `out.len()` bytes starting at `off` into `out`. The caller has bounds-checked.
    pub(crate) fn read(&self, off: usize, out: &mut [u8]) {
        let mut done = 0;
        while done < out.len() {
            let pos = off + done;
            let (page, within) = (pos / PAGE, pos % PAGE);
            let n = (PAGE - within).min(out.len() - done);
            let dst = &mut out[done..done + n];
            match self.pages.get(&page) {
                Some(bytes) => dst.copy_from_slice(&bytes[within..within + n]),
                None => dst.fill(self.fill),
            }
            done += n;
        }
    }

    /// Writes `data` at `off`. The caller has bounds-checked.
    pub(crate) fn write(&mut self, off: usize, data: &[u8]) {
        let mut done = 0;
        while done < data.len() {
            let pos = off + done;
            let (page, within) = (pos / PAGE, pos % PAGE);
            let n = (PAGE - within).min(data.len() - done);
            let fill = self.fill;
            let bytes = self
                .pages
                .entry(page)
                .or_insert_with(|| vec![fill; PAGE].into_boxed_slice());
            bytes[within..within + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
    }

    /// Writes `len` bytes at `off`, repeating `pattern` (whose length divides into 4-byte
    /// memsets as well as byte memsets). The caller has bounds-checked.
    pub(crate) fn fill_pattern(&mut self, off: usize, len: usize, pattern: &[u8]) {
        if pattern.is_empty() {
            return;
        }
        // One page-sized chunk of the pattern, reused for every page written.
        let chunk_len = PAGE.min(len);
        let chunk: Vec<u8> = pattern.iter().copied().cycle().take(chunk_len).collect();
        let mut done = 0;
        while done < len {
            let n = chunk_len.min(len - done);
            // `done` is always a multiple of chunk_len, itself a multiple of the pattern length
            // whenever len is, so the pattern stays in phase across chunks.
            self.write(off + done, &chunk[..n]);
            done += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_fill_until_written_across_pages() {
        let mut s = Storage::new(0xFF);
        s.write(PAGE - 2, &[1, 2, 3, 4]);
        let mut out = [0u8; 6];
        s.read(PAGE - 3, &mut out);
        assert_eq!(out, [0xFF, 1, 2, 3, 4, 0xFF]);
        s.reset(0);
        s.read(PAGE - 3, &mut out);
        assert_eq!(out, [0; 6]);
    }

    #[test]
    fn pattern_fill_stays_in_phase() {
        let mut s = Storage::new(0);
        let len = PAGE * 2 + 8;
        s.fill_pattern(4, len, &[1, 2, 3, 4]);
        let mut out = vec![0u8; len];
        s.read(4, &mut out);
        assert!(out.chunks(4).all(|c| c == [1, 2, 3, 4]));
    }
}
