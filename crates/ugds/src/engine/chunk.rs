//! Splitting one request into commands.

use ugds_nvme::prp;

/// One command's share of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// First logical block.
    pub slba: u64,
    /// Number of logical blocks (1..=65536).
    pub nlb: u32,
    /// Offset of the chunk's first byte in the buffer's page table.
    pub data_off: usize,
    /// Bytes.
    pub len: usize,
}

/// Splits `len` bytes at byte `file_off` of the namespace, going to or from
/// `data_off` bytes into a page table, into commands that each respect MDTS,
/// fit one PRP-list page, and carry at most 65536 blocks (NLB is 16 bits).
#[derive(Clone, Debug)]
pub struct Chunker {
    file_off: u64,
    data_off: usize,
    remaining: usize,
    block: usize,
    /// log2 of `block`: sizes and offsets are shifted, not divided.
    block_shift: u32,
    page_size: usize,
    max_transfer: Option<usize>,
}

impl Chunker {
    /// A chunker for an already validated request (`file_off` and `len`
    /// multiples of `block`).
    pub fn new(
        file_off: u64,
        data_off: usize,
        len: usize,
        block: usize,
        page_size: usize,
        max_transfer: Option<usize>,
    ) -> Chunker {
        debug_assert!(block.is_power_of_two() && page_size.is_power_of_two());
        debug_assert!(file_off % block as u64 == 0 && len % block == 0);
        Chunker {
            file_off,
            data_off,
            remaining: len,
            block,
            block_shift: block.trailing_zeros(),
            page_size,
            max_transfer,
        }
    }

    /// Commands still to come.
    pub fn commands(&self) -> usize {
        if self.remaining == 0 {
            return 0;
        }
        // Fast path: the whole request fits the first command.
        if self.remaining <= self.first_cap() {
            return 1;
        }
        self.clone().fold(0, |n, _| n + 1)
    }

    /// The whole range: its first block, where it starts in the buffer,
    /// and its length.
    pub fn range(&self) -> (u64, usize, usize) {
        (self.file_off >> self.block_shift, self.data_off, self.remaining)
    }

    /// log2 of the block size.
    pub fn block_shift(&self) -> u32 {
        self.block_shift
    }

    fn first_cap(&self) -> usize {
        prp::max_chunk_bytes(self.page_size, self.data_off & (self.page_size - 1), self.max_transfer, self.block)
            .min(65536 * self.block)
            .max(self.block)
    }
}

impl Iterator for Chunker {
    type Item = Chunk;

    fn next(&mut self) -> Option<Chunk> {
        if self.remaining == 0 {
            return None;
        }
        let len = self.remaining.min(self.first_cap());
        let c = Chunk {
            slba: self.file_off >> self.block_shift,
            nlb: (len >> self.block_shift) as u32,
            data_off: self.data_off,
            len,
        };
        self.file_off += len as u64;
        self.data_off += len;
        self.remaining -= len;
        Some(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn splits_at_mdts() {
        let c: Vec<_> = Chunker::new(4096, 0, 300 * 1024, 512, 4096, Some(128 * 1024)).collect();
        assert_eq!(c.len(), 3);
        assert_eq!(c[0], Chunk { slba: 8, nlb: 256, data_off: 0, len: 128 * 1024 });
        assert_eq!(c[2].len, 44 * 1024);
        assert_eq!(c[2].slba, 8 + 512);
    }

    proptest! {
        #[test]
        fn chunks_tile_the_request(
            blocks in 1usize..5000,
            block_log in 9u32..13,
            first in 0usize..4096,
            mdts in proptest::option::of(0u32..6),
        ) {
            let block = 1usize << block_log;
            let data_off = first & !3;
            let max = mdts.map(|m| 4096usize << m);
            let len = blocks * block;
            let pages: Vec<u64> = (0..(data_off + len) / 4096 + 2).map(|i| (i as u64 + 1) << 12).collect();
            let mut next_file = 0u64;
            let mut next_data = data_off;
            for c in Chunker::new(0, data_off, len, block, 4096, max) {
                prop_assert_eq!(c.slba * block as u64, next_file);
                prop_assert_eq!(c.data_off, next_data);
                prop_assert_eq!(c.len, c.nlb as usize * block);
                prop_assert!(c.nlb >= 1 && c.nlb <= 65536);
                if let Some(m) = max { prop_assert!(c.len <= m.max(block)); }
                prop_assert!(prp::plan(&pages, 4096, c.data_off, c.len).is_ok());
                next_file += c.len as u64;
                next_data += c.len;
            }
            prop_assert_eq!(next_file as usize, len);
        }
    }
}
