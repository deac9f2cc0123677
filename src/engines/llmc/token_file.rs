//! llm.c's token files (`dev/data/data_common.py` writes them, `llmc/dataloader.h` reads
//! them): a header of 256 little-endian int32 (magic 20240520, version 1, the token count,
//! zeros), then the GPT-2 token ids as little-endian uint16.

use crate::error::{Error, Result};
use std::path::Path;

pub const MAGIC: i32 = 20240520;
pub const VERSION: i32 = 1;
/// int32 values in the header.
pub const HEADER_INTS: usize = 256;

/// The file's bytes for `ids`; an id above 65535 (not a GPT-2 token) is an error.
pub fn encode(ids: &[u32]) -> Result<Vec<u8>> {
    let count = i32::try_from(ids.len()).map_err(|_| {
        Error::Config(format!(
            "{} tokens do not fit llm.c's int32 token count",
            ids.len()
        ))
    })?;
    let mut header = [0i32; HEADER_INTS];
    header[..3].copy_from_slice(&[MAGIC, VERSION, count]);
    let mut bytes = Vec::with_capacity(HEADER_INTS * 4 + ids.len() * 2);
    bytes.extend(header.iter().flat_map(|v| v.to_le_bytes()));
    for &id in ids {
        let id = u16::try_from(id).map_err(|_| {
            Error::Config(format!(
                "token id {id} does not fit llm.c's uint16 token files (GPT-2's vocabulary does)"
            ))
        })?;
        bytes.extend(id.to_le_bytes());
    }
    Ok(bytes)
}

/// Writes `blocks`, concatenated, then `<|endoftext|>` (`eot`): llm.c reads T + 1 tokens a row
/// (the targets are the inputs shifted by one), so the closing token gives the last block's last
/// position a target and every block a place in a batch.
pub fn write_blocks(path: &Path, blocks: &[Vec<u32>], eot: u32) -> Result<()> {
    let mut ids: Vec<u32> = blocks.iter().flatten().copied().collect();
    ids.push(eot);
    std::fs::write(path, encode(&ids)?)
        .map_err(|e| Error::io(format!("writing llm.c token file {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_then_little_endian_u16_ids() {
        let b = encode(&[50256, 1, 258]).unwrap();
        assert_eq!(b.len(), 1024 + 6);
        let int = |i: usize| i32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap());
        assert_eq!((int(0), int(1), int(2)), (20240520, 1, 3));
        assert!((3..256).all(|i| int(i) == 0));
        assert_eq!(&b[1024..], &[0x50, 0xc4, 1, 0, 2, 1]);
        let e = encode(&[70000]).unwrap_err().to_string();
        assert!(e.contains("token id 70000"), "{e}");
    }
}
