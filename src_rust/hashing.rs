//! Block hashing, the router's own scheme, whatever the engines use (their
//! block ids stay opaque ids: docs/deployment.md, "How events become index
//! entries"). A full block of `block_size` u32 tokens has a local hash,
//! xxh3-64 of its little-endian bytes seeded from the namespace; block i's
//! sequence hash chains block i-1's sequence hash with local hash i. A
//! partial last block is never hashed.

use crate::ids::{LocalHash, SeqHash};
use std::borrow::Cow;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

pub const DEFAULT_BLOCK_SIZE: usize = 16;

/// Between a model and a cache salt in a hash namespace: a control
/// character, which neither a model name nor a salt may hold, so no two
/// (model, salt) pairs join alike.
const SALT_SEPARATOR: char = '\u{1f}';

/// The namespace a request's blocks hash in: its model (`model` or
/// `model:adapter`), salted by its `namespace` when it names one. With no
/// model, the namespace alone, as before models were named; so two models
/// never share cached blocks, and a salt never crosses models.
pub fn model_namespace<'a>(model: &'a str, namespace: &'a str) -> Cow<'a, str> {
    match (model.is_empty(), namespace.is_empty()) {
        (true, _) => Cow::Borrowed(namespace),
        (false, true) => Cow::Borrowed(model),
        (false, false) => Cow::Owned(format!("{model}{SALT_SEPARATOR}{namespace}")),
    }
}

/// The seed for a namespace (model name, LoRA adapter and cache salt, joined
/// by the caller). Different namespaces never share cached blocks.
pub fn namespace_seed(namespace: &str) -> u64 {
    xxh3_64(namespace.as_bytes())
}

/// Hashes token blocks for one namespace and block size.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct BlockHasher {
    pub block_size: usize,
    pub seed: u64,
}

impl BlockHasher {
    pub fn new(block_size: usize, seed: u64) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        BlockHasher { block_size, seed }
    }

    pub fn for_namespace(block_size: usize, namespace: &str) -> Self {
        Self::new(block_size, namespace_seed(namespace))
    }

    /// Local hash of one full block.
    pub fn local_hash(&self, block: &[u32]) -> LocalHash {
        debug_assert_eq!(block.len(), self.block_size);
        LocalHash(xxh3_64_with_seed(
            tokens_as_le_bytes(block).as_ref(),
            self.seed,
        ))
    }

    /// Local hashes of every full block; the partial tail is ignored.
    pub fn local_hashes(&self, tokens: &[u32]) -> Vec<LocalHash> {
        tokens
            .chunks_exact(self.block_size)
            .map(|block| self.local_hash(block))
            .collect()
    }

    /// Sequence hashes of every full block; the partial tail is ignored.
    pub fn seq_hashes(&self, tokens: &[u32]) -> Vec<SeqHash> {
        let mut parent = None;
        tokens
            .chunks_exact(self.block_size)
            .map(|block| {
                let hash = chain(parent, self.local_hash(block));
                parent = Some(hash);
                hash
            })
            .collect()
    }
}

/// The sequence hash of a block whose prefix ends at `parent` (None: the
/// block starts the sequence).
#[inline]
pub fn chain(parent: Option<SeqHash>, local: LocalHash) -> SeqHash {
    match parent {
        None => SeqHash(local.0),
        Some(SeqHash(parent)) => {
            let mut bytes = [0u8; 16];
            bytes[..8].copy_from_slice(&parent.to_le_bytes());
            bytes[8..].copy_from_slice(&local.0.to_le_bytes());
            SeqHash(xxh3_64(&bytes))
        }
    }
}

/// Sequence hashes from local hashes, continuing after `parent`.
pub fn chain_all(parent: Option<SeqHash>, locals: &[LocalHash]) -> Vec<SeqHash> {
    let mut parent = parent;
    locals
        .iter()
        .map(|&local| {
            let hash = chain(parent, local);
            parent = Some(hash);
            hash
        })
        .collect()
}

#[cfg(target_endian = "little")]
fn tokens_as_le_bytes(tokens: &[u32]) -> std::borrow::Cow<'_, [u8]> {
    // SAFETY: u32 has no padding and any byte pattern is a valid u8; on a
    // little-endian target the in-memory bytes are the little-endian encoding.
    let bytes = unsafe {
        std::slice::from_raw_parts(tokens.as_ptr().cast::<u8>(), std::mem::size_of_val(tokens))
    };
    std::borrow::Cow::Borrowed(bytes)
}

#[cfg(target_endian = "big")]
fn tokens_as_le_bytes(tokens: &[u32]) -> std::borrow::Cow<'_, [u8]> {
    std::borrow::Cow::Owned(tokens.iter().flat_map(|t| t.to_le_bytes()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_hash_is_xxh3_of_le_bytes_with_namespace_seed() {
        let hasher = BlockHasher::for_namespace(4, "llama");
        let block = [1u32, 2, 3, 0xdead_beef];
        let bytes: Vec<u8> = block.iter().flat_map(|t| t.to_le_bytes()).collect();
        assert_eq!(
            hasher.local_hash(&block),
            LocalHash(xxh3_64_with_seed(&bytes, xxh3_64(b"llama")))
        );
    }

    #[test]
    fn a_model_namespace_is_the_salt_alone_without_a_model_and_never_crosses_models() {
        assert_eq!(model_namespace("", "salt"), "salt");
        assert_eq!(model_namespace("llama", ""), "llama");
        assert_eq!(model_namespace("llama:sql", ""), "llama:sql");
        let salted = [
            model_namespace("llama", "salt"),
            model_namespace("qwen", "salt"),
            model_namespace("", "salt"),
            model_namespace("llama", ""),
        ];
        for (i, a) in salted.iter().enumerate() {
            for b in &salted[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn partial_tail_is_not_hashed() {
        let hasher = BlockHasher::new(4, 0);
        assert_eq!(hasher.seq_hashes(&[1, 2, 3]).len(), 0);
        assert_eq!(hasher.seq_hashes(&[1, 2, 3, 4, 5, 6, 7]).len(), 1);
    }

    #[test]
    fn sequence_hash_depends_on_the_whole_prefix() {
        let hasher = BlockHasher::new(2, 0);
        let a = hasher.seq_hashes(&[1, 2, 3, 4]);
        let b = hasher.seq_hashes(&[9, 9, 3, 4]);
        assert_ne!(a[1], b[1]);
        assert_eq!(a[0], SeqHash(hasher.local_hash(&[1, 2]).0));
        assert_eq!(a[1], chain(Some(a[0]), hasher.local_hash(&[3, 4])));
    }

    #[test]
    fn namespaces_do_not_collide() {
        let tokens = [7u32; 16];
        let a = BlockHasher::for_namespace(16, "model-a").seq_hashes(&tokens);
        let b = BlockHasher::for_namespace(16, "model-b").seq_hashes(&tokens);
        assert_ne!(a, b);
    }

    #[test]
    fn chain_all_matches_seq_hashes() {
        let hasher = BlockHasher::new(4, 3);
        let tokens: Vec<u32> = (0..40).collect();
        let locals = hasher.local_hashes(&tokens);
        assert_eq!(chain_all(None, &locals), hasher.seq_hashes(&tokens));
    }
}
