//! Choosing among scored candidates: lowest cost, a session's last worker
//! or else a fair tie-break among equals, optional temperature sampling,
//! and skipping overloaded workers.

use super::cost::Cost;
use crate::ids::WorkerId;
use crate::index::TierDepths;

/// One worker as scored for one request.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Candidate {
    pub worker: WorkerId,
    pub overlap: TierDepths,
    pub cost: Cost,
    pub active_requests: u64,
    /// Skipped because it carries more than its share of the pool's requests.
    pub overloaded: bool,
}

/// How the winner was found, for the explanation.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Pick {
    Cheapest,
    /// Within the tie tolerance of the cheapest, broken by fewest active
    /// requests, then in turn; carries how many tied.
    Tie(usize),
    /// The session's last worker, among this many tied (`Selector::pick`).
    Affinity(usize),
    Sampled,
}

#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Selector {
    pub temperature: f64,
    pub tie_tolerance: f64,
    /// A worker with more than `overload_factor` × the pool's mean active
    /// requests (plus one) is skipped while any other worker is not. 0: off.
    pub overload_factor: f64,
}

/// splitmix64: tiny, seedable, good enough to sample among a few workers.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

impl Selector {
    /// Marks overloaded candidates; they stay in the list for the explanation.
    pub fn mark_overloaded(&self, candidates: &mut [Candidate]) {
        if self.overload_factor <= 0.0 || candidates.len() < 2 {
            return;
        }
        let mean = candidates
            .iter()
            .map(|c| c.active_requests as f64)
            .sum::<f64>()
            / candidates.len() as f64;
        let limit = self.overload_factor * mean + 1.0;
        for c in candidates.iter_mut() {
            c.overloaded = c.active_requests as f64 > limit;
        }
        if candidates.iter().all(|c| c.overloaded) {
            candidates.iter_mut().for_each(|c| c.overloaded = false);
        }
    }

    /// Index of the winner among the candidates not marked overloaded.
    /// `turn` rotates among exact ties so equal workers share the work.
    /// `prefer` is the request's session's last worker: it wins when it is
    /// among those within the tie tolerance of the cheapest and holds as
    /// much of the prompt as any of them, so it never beats a cheaper or
    /// better-cached candidate.
    pub fn pick(
        &self,
        candidates: &[Candidate],
        rng: &mut Rng,
        turn: u64,
        prefer: Option<WorkerId>,
    ) -> Option<(usize, Pick)> {
        let eligible: Vec<usize> = (0..candidates.len())
            .filter(|&i| !candidates[i].overloaded)
            .collect();
        let best = eligible
            .iter()
            .map(|&i| candidates[i].cost.total())
            .fold(f64::INFINITY, f64::min);
        if eligible.is_empty() {
            return None;
        }
        let limit = best * (1.0 + self.tie_tolerance) + 1e-9;
        let tied: Vec<usize> = eligible
            .iter()
            .copied()
            .filter(|&i| candidates[i].cost.total() <= limit)
            .collect();
        if let Some(i) = prefer.and_then(|w| affine(candidates, &tied, w)) {
            return Some((i, Pick::Affinity(tied.len())));
        }
        if self.temperature > 0.0 && eligible.len() > 1 {
            let scale = self.temperature * best.max(1.0);
            let weights: Vec<f64> = eligible
                .iter()
                .map(|&i| (-(candidates[i].cost.total() - best) / scale).exp())
                .collect();
            let mut target = rng.next_f64() * weights.iter().sum::<f64>();
            for (k, w) in weights.iter().enumerate() {
                if target < *w {
                    return Some((eligible[k], Pick::Sampled));
                }
                target -= w;
            }
            return Some((*eligible.last().expect("non-empty"), Pick::Sampled));
        }
        if tied.len() == 1 {
            return Some((tied[0], Pick::Cheapest));
        }
        let fewest = tied
            .iter()
            .map(|&i| candidates[i].active_requests)
            .min()
            .expect("non-empty");
        let least: Vec<usize> = tied
            .iter()
            .copied()
            .filter(|&i| candidates[i].active_requests == fewest)
            .collect();
        Some((
            least[(turn % least.len() as u64) as usize],
            Pick::Tie(tied.len()),
        ))
    }
}

/// The preferred worker's index among `tied`, unless another tied
/// candidate holds more of the prompt.
fn affine(candidates: &[Candidate], tied: &[usize], worker: WorkerId) -> Option<usize> {
    let &i = tied.iter().find(|&&i| candidates[i].worker == worker)?;
    let most = tied
        .iter()
        .map(|&t| candidates[t].overlap.total())
        .max()
        .unwrap_or(0);
    (candidates[i].overlap.total() >= most).then_some(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(worker: u64, cost_ms: f64, active: u64) -> Candidate {
        Candidate {
            worker: WorkerId(worker),
            overlap: TierDepths::default(),
            cost: Cost {
                prefill_ms: cost_ms,
                ..Cost::default()
            },
            active_requests: active,
            overloaded: false,
        }
    }

    fn selector() -> Selector {
        Selector {
            temperature: 0.0,
            tie_tolerance: 0.02,
            overload_factor: 0.0,
        }
    }

    #[test]
    fn cheapest_wins() {
        let c = [
            candidate(1, 50.0, 0),
            candidate(2, 10.0, 5),
            candidate(3, 30.0, 0),
        ];
        assert_eq!(
            selector().pick(&c, &mut Rng::new(1), 0, None),
            Some((1, Pick::Cheapest))
        );
    }

    #[test]
    fn ties_go_to_the_least_busy_then_rotate() {
        let c = [
            candidate(1, 10.0, 3),
            candidate(2, 10.1, 1),
            candidate(3, 10.0, 1),
        ];
        let picks: Vec<usize> = (0..4)
            .map(|t| selector().pick(&c, &mut Rng::new(1), t, None).unwrap().0)
            .collect();
        assert_eq!(picks, vec![1, 2, 1, 2]);
    }

    #[test]
    fn sampling_prefers_cheap_but_explores() {
        let s = Selector {
            temperature: 0.5,
            ..selector()
        };
        let c = [candidate(1, 10.0, 0), candidate(2, 15.0, 0)];
        let mut rng = Rng::new(7);
        let first = (0..1000)
            .filter(|_| s.pick(&c, &mut rng, 0, None).unwrap().0 == 0)
            .count();
        assert!(first > 600 && first < 1000, "{first}");
    }

    #[test]
    fn overloaded_workers_are_skipped_unless_all_are() {
        let s = Selector {
            overload_factor: 1.5,
            ..selector()
        };
        let mut c = [
            candidate(1, 1.0, 40),
            candidate(2, 100.0, 2),
            candidate(3, 100.0, 3),
        ];
        s.mark_overloaded(&mut c);
        assert!(c[0].overloaded && !c[1].overloaded);
        assert_eq!(s.pick(&c, &mut Rng::new(1), 0, None).unwrap().0, 1);
        let mut lone = [candidate(1, 1.0, 40)];
        s.mark_overloaded(&mut lone);
        assert!(!lone[0].overloaded);
    }
}
