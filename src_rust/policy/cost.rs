//! The cost of sending a request to a worker: its predicted time to first
//! token, in milliseconds, split into the parts an explanation shows.

use super::models::ModelId;
use super::sessions::SessionKey;
use crate::ids::SeqHash;
use crate::index::TierDepths;

/// Coefficients of the TTFT model. Defaults fit an H100-class engine serving
/// an 8B model with chunked prefill (see docs/routing.md).
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Coefficients {
    /// Fixed cost of a prefill (scheduling, the first decode step).
    pub prefill_base_ms: f64,
    /// Prefill of n new tokens after p cached ones costs
    /// `prefill_ms_per_token * n + attention_ms_per_token2 * n * (p + n / 2)`.
    pub prefill_ms_per_token: f64,
    pub attention_ms_per_token2: f64,
    /// Every engine iteration also reads the KV of the running decodes.
    pub decode_ms_per_block: f64,
    /// Bringing a matched block back to the device from host memory or disk.
    pub host_reload_ms_per_block: f64,
    pub disk_reload_ms_per_block: f64,
    /// Moving one block from a prefill worker to a decode worker.
    pub transfer_ms_per_block: f64,
    /// Prefill tokens one engine iteration takes (the chunk size).
    pub max_batched_tokens: f64,
}

impl Default for Coefficients {
    fn default() -> Self {
        Coefficients {
            prefill_base_ms: 12.0,
            prefill_ms_per_token: 0.02,
            attention_ms_per_token2: 1.06e-8,
            decode_ms_per_block: 0.0032,
            host_reload_ms_per_block: 0.05,
            disk_reload_ms_per_block: 0.5,
            transfer_ms_per_block: 0.1,
            max_batched_tokens: 8192.0,
        }
    }
}

/// What a worker carries when a request is scored against it.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct Load {
    pub queued_prefill_tokens: u64,
    pub active_decode_blocks: u64,
    pub active_requests: u64,
    pub capacity_blocks: u64,
    /// Blocks its cache holds, running requests' and evictable ones (by the
    /// index); 0 when the policy does not price pollution, which reads it.
    pub cached_blocks: u64,
}

/// The request being scored.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct Request<'a> {
    /// Only this model's workers are candidates.
    pub model: ModelId,
    pub num_tokens: u64,
    pub num_blocks: u64,
    pub block_size: u64,
    /// The prompt's block hashes, when the caller has them (empty when not).
    pub blocks: &'a [SeqHash],
    /// The session it belongs to, if the caller named one: its last
    /// workers win ties (sessions.rs).
    pub session: Option<SessionKey>,
}

/// One candidate's predicted TTFT and its parts, in ms.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct Cost {
    pub queue_ms: f64,
    pub prefill_ms: f64,
    pub reload_ms: f64,
    pub decode_ms: f64,
    pub transfer_ms: f64,
    /// Blocks the request would push out of a full cache, priced as prefill.
    pub overflow_ms: f64,
    /// The prefill this worker would compute beyond the best-cached
    /// candidate, times the requests already queued here that it stands for:
    /// the delay the wasted work passes on to the requests that queue after
    /// it. Zero on an idle worker, dominant when every worker is backlogged.
    pub congestion_ms: f64,
    /// The worker's running streams each wait for this request's prefill
    /// iterations (`decode_impact`).
    pub stall_ms: f64,
    /// Decode steps it shares with those streams, each slower by the KV the
    /// other side reads: its own step by theirs, theirs by its own.
    pub slowdown_ms: f64,
    /// The recomputation its new blocks push onto later requests by evicting
    /// cached blocks those would have hit (`Coefficients::pollution`).
    pub pollution_ms: f64,
    /// Its queue wait again, times how many typical first tokens its TTFT
    /// here exceeds the typical one by (`PolicyConfig::tail_weight`): what
    /// keeping it waiting costs the slowest first tokens, which a sum of
    /// latencies does not see.
    pub tail_ms: f64,
}

impl Cost {
    /// What the placement costs all requests together: this one's TTFT,
    /// plus what it adds to the latency of those queued behind it and of
    /// those decoding beside it, plus the tail term on its own wait.
    pub fn total(&self) -> f64 {
        self.ttft_ms()
            + self.congestion_ms
            + self.stall_ms
            + self.slowdown_ms
            + self.pollution_ms
            + self.tail_ms
    }

    /// This request's predicted time to first token.
    pub fn ttft_ms(&self) -> f64 {
        self.queue_ms
            + self.prefill_ms
            + self.reload_ms
            + self.decode_ms
            + self.transfer_ms
            + self.overflow_ms
    }

    /// The compute the placement costs the pool.
    pub fn work_ms(&self) -> f64 {
        self.prefill_ms + self.reload_ms
    }
}

impl Coefficients {
    /// Time to prefill `new` tokens after `cached` ones, on an idle worker.
    pub fn prefill_ms(&self, new: f64, cached: f64) -> f64 {
        if new <= 0.0 {
            return self.prefill_base_ms;
        }
        self.prefill_base_ms
            + self.prefill_ms_per_token * new
            + self.attention_ms_per_token2 * new * (cached + new / 2.0)
    }

    /// Time to work through `queued` prefill tokens waiting on a worker:
    /// they take at least `ceil(queued / max_batched_tokens)` iterations,
    /// and each pays the fixed cost that a request's own prefill pays once
    /// (priced by its tokens alone, a queue looked cheaper than the
    /// iterations the engine runs for it; docs/routing.md, "The queue's
    /// iterations").
    pub fn queue_ms(&self, queued: f64) -> f64 {
        self.iterations(queued) * self.prefill_base_ms + self.prefill_ms_per_token * queued
    }

    /// Engine iterations that `tokens` of prefill take at the least.
    fn iterations(&self, tokens: f64) -> f64 {
        (tokens / self.max_batched_tokens.max(1.0)).ceil()
    }

    /// Tokens this worker would still have to compute for the request.
    pub fn uncached_tokens(&self, request: &Request, overlap: TierDepths) -> u64 {
        let cached = u64::from(overlap.total()) * request.block_size;
        request.num_tokens.saturating_sub(cached)
    }

    /// Predicted TTFT of prefilling the request on a worker (aggregated, or
    /// the prefill side of a split).
    pub fn prefill_cost(&self, request: &Request, overlap: TierDepths, load: &Load) -> Cost {
        let new = self.uncached_tokens(request, overlap) as f64;
        let cached = request.num_tokens as f64 - new;
        let queued = load.queued_prefill_tokens as f64;
        let iterations = self.iterations(queued + new).max(1.0);
        let free = load
            .capacity_blocks
            .saturating_sub(load.active_decode_blocks);
        let overflow_blocks = request
            .num_blocks
            .saturating_sub(u64::from(overlap.total()))
            .saturating_sub(free);
        Cost {
            queue_ms: self.queue_ms(queued),
            prefill_ms: self.prefill_ms(new, cached),
            reload_ms: f64::from(overlap.host) * self.host_reload_ms_per_block
                + f64::from(overlap.disk) * self.disk_reload_ms_per_block,
            decode_ms: iterations * self.decode_ms_per_block * load.active_decode_blocks as f64,
            transfer_ms: 0.0,
            overflow_ms: overflow_blocks as f64
                * request.block_size as f64
                * self.prefill_ms_per_token,
            ..Cost::default()
        }
    }

    /// What placing the request on a worker does to the streams decoding
    /// there, over the `shared_steps` decode steps it overlaps with them
    /// (`Lifetime::shared_steps`): each running stream waits `work_ms` for
    /// its prefill (`Cost::stall_ms`), and every shared step is slower for
    /// it by their KV and for each of them by its own (`Cost::slowdown_ms`).
    /// Returns (stall, slowdown) in ms of latency summed over requests.
    pub fn decode_impact(
        &self,
        request: &Request,
        load: &Load,
        work_ms: f64,
        shared_steps: f64,
    ) -> (f64, f64) {
        let streams = load.active_requests as f64;
        let read_blocks = load.active_decode_blocks as f64 + streams * request.num_blocks as f64;
        (
            streams * work_ms,
            shared_steps * self.decode_ms_per_block * read_blocks,
        )
    }

    /// What the request's new blocks cost later requests on a worker: those
    /// past the cache's free room evict as many cached blocks, each of which
    /// a later request would have hit with the worker's recent hit rate
    /// (`hit_rate`) and now recomputes, unless the request's own blocks
    /// are as likely to be hit as the ones they push out (`reuse`: the
    /// share of its prompt cached anywhere, so a shared prefix replaces
    /// its like and a one-off prompt pays in full). In ms of prefill.
    pub fn pollution(
        &self,
        request: &Request,
        overlap: TierDepths,
        load: &Load,
        hit_rate: f64,
        reuse: f64,
    ) -> f64 {
        let new_blocks = request.num_blocks.saturating_sub(u64::from(overlap.device));
        let room = load
            .capacity_blocks
            .saturating_sub(load.cached_blocks.max(load.active_decode_blocks));
        let evicted = new_blocks.saturating_sub(room) as f64;
        evicted
            * request.block_size as f64
            * self.prefill_ms_per_token
            * (hit_rate - reuse).max(0.0)
    }

    /// The decode side of a split: receiving the blocks it lacks and running
    /// the first step among its current decodes.
    pub fn decode_cost(&self, request: &Request, overlap: TierDepths, load: &Load) -> Cost {
        let missing = request.num_blocks.saturating_sub(u64::from(overlap.device));
        let free = load
            .capacity_blocks
            .saturating_sub(load.active_decode_blocks);
        let overflow_blocks = missing.saturating_sub(free);
        Cost {
            decode_ms: self.decode_ms_per_block * load.active_decode_blocks as f64,
            transfer_ms: missing as f64 * self.transfer_ms_per_block,
            overflow_ms: overflow_blocks as f64
                * request.block_size as f64
                * self.prefill_ms_per_token,
            ..Cost::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(tokens: u64) -> Request<'static> {
        Request {
            num_tokens: tokens,
            num_blocks: tokens / 64,
            block_size: 64,
            ..Request::default()
        }
    }

    fn idle() -> Load {
        Load {
            capacity_blocks: 16_384,
            ..Load::default()
        }
    }

    fn device(blocks: u32) -> TierDepths {
        TierDepths {
            device: blocks,
            host: 0,
            disk: 0,
        }
    }

    #[test]
    fn cached_prefix_lowers_the_cost() {
        let c = Coefficients::default();
        let cold = c.prefill_cost(&request(6400), device(0), &idle());
        let warm = c.prefill_cost(&request(6400), device(90), &idle());
        assert!(warm.total() < cold.total() / 5.0);
        assert_eq!(c.uncached_tokens(&request(6400), device(90)), 640);
    }

    #[test]
    fn a_queue_costs_its_tokens_and_the_iterations_they_take() {
        let c = Coefficients::default();
        let extra = |queued| {
            let busy = Load {
                queued_prefill_tokens: queued,
                ..idle()
            };
            c.prefill_cost(&request(640), device(0), &busy).total()
                - c.prefill_cost(&request(640), device(0), &idle()).total()
        };
        let tokens = |n: u64| n as f64 * c.prefill_ms_per_token;
        assert_eq!(extra(0), 0.0);
        // A queue of one token still holds the request for an iteration.
        assert!((extra(1) - (c.prefill_base_ms + tokens(1))).abs() < 1e-9);
        assert!((extra(8_192) - (c.prefill_base_ms + tokens(8_192))).abs() < 1e-9);
        assert!((extra(10_000) - (2.0 * c.prefill_base_ms + tokens(10_000))).abs() < 1e-9);
    }

    #[test]
    fn host_and_disk_hits_cost_a_reload() {
        let c = Coefficients::default();
        let host = TierDepths {
            device: 0,
            host: 10,
            disk: 0,
        };
        let disk = TierDepths {
            device: 0,
            host: 0,
            disk: 10,
        };
        let on_device = c.prefill_cost(&request(640), device(10), &idle()).total();
        let on_host = c.prefill_cost(&request(640), host, &idle()).total();
        let on_disk = c.prefill_cost(&request(640), disk, &idle()).total();
        assert!(on_device < on_host && on_host < on_disk);
    }

    #[test]
    fn decode_pressure_grows_with_active_blocks() {
        let c = Coefficients::default();
        let loaded = Load {
            active_decode_blocks: 10_000,
            ..idle()
        };
        let cost = c.prefill_cost(&request(640), device(0), &loaded);
        assert!((cost.decode_ms - 10_000.0 * c.decode_ms_per_block).abs() < 1e-9);
    }

    #[test]
    fn a_full_cache_prices_the_overflow() {
        let c = Coefficients::default();
        let full = Load {
            active_decode_blocks: 16_380,
            ..idle()
        };
        assert!(c.prefill_cost(&request(640), device(0), &full).overflow_ms > 0.0);
        assert_eq!(
            c.prefill_cost(&request(640), device(0), &idle())
                .overflow_ms,
            0.0
        );
    }

    #[test]
    fn decode_impact_grows_with_the_streams_running_there() {
        let c = Coefficients::default();
        let busy = Load {
            active_decode_blocks: 4_000,
            active_requests: 20,
            ..idle()
        };
        let r = request(6400);
        assert_eq!(c.decode_impact(&r, &idle(), 50.0, 100.0), (0.0, 0.0));
        let (stall, slowdown) = c.decode_impact(&r, &busy, 50.0, 100.0);
        assert!((stall - 20.0 * 50.0).abs() < 1e-9);
        let read = 4_000.0 + 20.0 * 100.0;
        assert!((slowdown - 100.0 * c.decode_ms_per_block * read).abs() < 1e-9);
        assert_eq!(c.decode_impact(&r, &busy, 50.0, 0.0).1, 0.0);
    }

    #[test]
    fn only_blocks_past_the_free_room_pollute_and_only_what_they_are_worth() {
        let c = Coefficients::default();
        let r = request(6400); // 100 blocks
        let full = Load {
            cached_blocks: 16_384,
            ..idle()
        };
        let per_block = 64.0 * c.prefill_ms_per_token;
        // A cache with room for it evicts nothing.
        assert_eq!(c.pollution(&r, device(0), &idle(), 1.0, 0.0), 0.0);
        // A full one evicts the 90 blocks it lacks, each worth its hit rate.
        let evicts = c.pollution(&r, device(10), &full, 0.5, 0.0);
        assert!((evicts - 90.0 * per_block * 0.5).abs() < 1e-9);
        // Blocks as likely to be hit as those they push out cost nothing.
        assert_eq!(c.pollution(&r, device(10), &full, 0.5, 0.6), 0.0);
        let room_for_40 = Load {
            cached_blocks: 16_384 - 40,
            ..idle()
        };
        let some = c.pollution(&r, device(10), &room_for_40, 1.0, 0.0);
        assert!((some - 50.0 * per_block).abs() < 1e-9);
    }

    #[test]
    fn decode_side_pays_transfer_for_missing_blocks() {
        let c = Coefficients::default();
        let cost = c.decode_cost(&request(640), device(4), &idle());
        assert!((cost.transfer_ms - 6.0 * c.transfer_ms_per_block).abs() < 1e-9);
    }
}
