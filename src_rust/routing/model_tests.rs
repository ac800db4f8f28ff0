//! Each model hashes in its own namespace: a prompt's cached prefix counts
//! for its model's workers only, even when another model's workers cached
//! the very same tokens.

use super::*;
use crate::hashing::namespace_seed;
use crate::ids::{EngineBlockId, Tier};
use crate::index::{BlockContent, EventBatch, IndexConfig, KvEvent};
use crate::policy::{Role, Serves};

const BS: u64 = 16;
/// Long enough that a cached prefix outweighs the tie tolerance.
const BLOCKS: u32 = 256;

/// Worker `worker` stores `tokens` as a worker serving `model` publishes
/// them: in the model's namespace.
fn store(index: &PrefixIndex, worker: u64, model: &str, tokens: &[u32]) {
    let namespace = model_namespace(model, "");
    let hashes = BlockHasher::for_namespace(BS as usize, &namespace).seq_hashes(tokens);
    let stored = KvEvent::Stored {
        parent: None,
        block_ids: hashes.iter().map(|h| EngineBlockId(h.0)).collect(),
        content: BlockContent::Tokens(tokens.to_vec()),
        tier: Tier::Device,
        namespace_seed: namespace_seed(&namespace),
    };
    let batch = EventBatch {
        worker: WorkerId(worker),
        seq: 0,
        events: vec![stored],
    };
    index.apply(&batch, false).unwrap();
}

/// The chosen worker and its overlap; the request is then released, so
/// that its load weighs nothing on the next.
fn routed(router: &Router, index: &PrefixIndex, id: &str, model: &str, t: &[u32]) -> (u64, u32) {
    let prompt = Prompt::Tokens {
        tokens: t,
        namespace: "",
    };
    let d = router
        .route(index, id, model, "", prompt, 0)
        .unwrap()
        .decision;
    let chosen = d
        .decode_candidates
        .iter()
        .find(|c| c.worker == d.decode_worker)
        .unwrap();
    router.release(id);
    (d.decode_worker.0, chosen.overlap.total())
}

/// An empty index, and a router over workers 0, 1, ... serving `serves`.
fn index_and_router(serves: &[Serves]) -> (PrefixIndex, Router) {
    let index = PrefixIndex::new(IndexConfig {
        block_size: BS as usize,
        max_nodes: None,
    });
    let router = Router::new(BS, PolicyConfig::default(), RouterOptions::default()).unwrap();
    router.with_pool(|pool| {
        for (w, serves) in serves.iter().enumerate() {
            pool.upsert_worker(WorkerId(w as u64), Role::Both, 10_000, serves);
        }
    });
    (index, router)
}

#[test]
fn a_prefix_is_reused_within_its_model_and_never_across_models() {
    let (index, router) = index_and_router(&["llama", "llama", "qwen", "qwen"].map(Serves::model));
    let tokens: Vec<u32> = (0..BLOCKS * BS as u32).collect();
    store(&index, 1, "llama", &tokens);
    assert_eq!(routed(&router, &index, "a", "llama", &tokens), (1, BLOCKS));
    let (worker, overlap) = routed(&router, &index, "b", "qwen", &tokens);
    assert!(worker == 2 || worker == 3, "{worker}");
    assert_eq!(overlap, 0, "llama's blocks are no hit for qwen");
    store(&index, 3, "qwen", &tokens);
    assert_eq!(routed(&router, &index, "c", "qwen", &tokens), (3, BLOCKS));
    assert_eq!(routed(&router, &index, "d", "llama", &tokens), (1, BLOCKS));
}

#[test]
fn an_adapter_named_by_itself_finds_the_blocks_cached_for_model_colon_adapter() {
    let with_sql = Serves {
        model: "llama".into(),
        adapters: vec!["sql".into()],
    };
    let (index, router) = index_and_router(&[with_sql.clone(), with_sql]);
    let tokens: Vec<u32> = (0..BLOCKS * BS as u32).collect();
    store(&index, 1, "llama:sql", &tokens);
    assert_eq!(
        routed(&router, &index, "a", "llama:sql", &tokens),
        (1, BLOCKS)
    );
    assert_eq!(routed(&router, &index, "b", "sql", &tokens), (1, BLOCKS));
    let (_, overlap) = routed(&router, &index, "c", "llama", &tokens);
    assert_eq!(
        overlap, 0,
        "the adapter's blocks are no hit for its base model"
    );
}
