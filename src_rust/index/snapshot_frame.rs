//! The frame around a snapshot's body, so that a torn or corrupt file is
//! refused rather than loaded with wrong workers, blocks or tiers:
//!
//! ```text
//! magic "KVRIDX" + 2-digit version (8) | body length, u64 LE (8) | xxh3-64 of the body, u64 LE (8) | body
//! ```
//!
//! bincode has no redundancy of its own: most flipped bytes still decode.

use xxhash_rust::xxh3::xxh3_64;

const MAGIC: &[u8; 6] = b"KVRIDX";
const VERSION: &[u8; 2] = b"03";
pub const HEADER_LEN: usize = 24;

/// `body` with its header in front.
pub fn seal(body: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(HEADER_LEN + body.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(VERSION);
    bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&xxh3_64(body).to_le_bytes());
    bytes.extend_from_slice(body);
    bytes
}

/// The body of a sealed snapshot, or why it cannot be trusted (one line).
pub fn open(bytes: &[u8]) -> Result<&[u8], String> {
    if bytes.len() < HEADER_LEN {
        return Err(format!(
            "truncated: {} bytes, shorter than the {HEADER_LEN}-byte header",
            bytes.len()
        ));
    }
    let (header, body) = bytes.split_at(HEADER_LEN);
    if &header[..6] != MAGIC {
        return Err("not a kvrouter index snapshot (wrong magic)".into());
    }
    if &header[6..8] != VERSION {
        return Err(format!(
            "format version {:?}, this build reads {:?}",
            String::from_utf8_lossy(&header[6..8]),
            String::from_utf8_lossy(VERSION)
        ));
    }
    let length = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
    if length != body.len() as u64 {
        return Err(format!(
            "truncated or overwritten: the header says {length} body bytes, {} follow",
            body.len()
        ));
    }
    let checksum = u64::from_le_bytes(header[16..24].try_into().expect("8 bytes"));
    if xxh3_64(body) != checksum {
        return Err("checksum mismatch: the body is corrupt".into());
    }
    Ok(body)
}
