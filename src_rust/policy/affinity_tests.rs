//! A session's last worker only ever breaks a tie: against any candidates,
//! the pick with a preference is the pick without one, unless the preferred
//! worker is tied with the cheapest and holds as much of the prompt as any
//! tied candidate; then it is that worker.

use super::cost::Cost;
use super::select::{Candidate, Pick, Rng, Selector};
use crate::ids::WorkerId;
use crate::index::TierDepths;
use proptest::prelude::*;

fn candidate() -> impl Strategy<Value = Candidate> {
    // Costs from a few values, so that ties are common.
    (
        prop_oneof![
            Just(10.0),
            Just(10.1),
            Just(10.5),
            Just(30.0),
            1.0..100.0f64
        ],
        0u32..4,
        0u64..6,
        prop::bool::weighted(0.2),
    )
        .prop_map(|(cost_ms, device, active, overloaded)| Candidate {
            worker: WorkerId(0),
            overlap: TierDepths {
                device,
                host: 0,
                disk: 0,
            },
            cost: Cost {
                prefill_ms: cost_ms,
                ..Cost::default()
            },
            active_requests: active,
            overloaded,
        })
}

fn candidates() -> impl Strategy<Value = Vec<Candidate>> {
    prop::collection::vec(candidate(), 1..8).prop_map(|mut all| {
        for (i, c) in all.iter_mut().enumerate() {
            c.worker = WorkerId(i as u64);
        }
        all
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn affinity_only_breaks_ties(
        all in candidates(),
        prefer in 0u64..9,
        temperature in prop_oneof![Just(0.0), Just(0.5)],
        turn in 0u64..8,
        seed in any::<u64>(),
    ) {
        let selector = Selector { temperature, tie_tolerance: 0.02, overload_factor: 0.0 };
        let plain = selector.pick(&all, &mut Rng::new(seed), turn, None);
        let chosen = selector.pick(&all, &mut Rng::new(seed), turn, Some(WorkerId(prefer)));
        let open: Vec<&Candidate> = all.iter().filter(|c| !c.overloaded).collect();
        let best = open.iter().map(|c| c.cost.total()).fold(f64::INFINITY, f64::min);
        let limit = best * 1.02 + 1e-9;
        let tied: Vec<&&Candidate> = open.iter().filter(|c| c.cost.total() <= limit).collect();
        let most = tied.iter().map(|c| c.overlap.total()).max();
        let wins = tied
            .iter()
            .find(|c| c.worker == WorkerId(prefer))
            .filter(|c| Some(c.overlap.total()) == most);
        match wins {
            Some(w) => {
                let (i, how) = chosen.expect("a tied worker exists");
                prop_assert_eq!(all[i].worker, w.worker);
                prop_assert_eq!(how, Pick::Affinity(tied.len()));
            }
            None => prop_assert_eq!(chosen, plain),
        }
        if let Some((i, _)) = chosen {
            prop_assert!(!all[i].overloaded);
        }
    }
}
