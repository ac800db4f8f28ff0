//! How many decode steps a new request shares with a stream already running
//! where it lands, measured online: how long requests stay between routing
//! and release, over how long a decode step takes, as running averages, so
//! the horizon follows the load rather than a setting.

/// Weight of each new sample in the running averages.
const ALPHA: f64 = 0.02;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Lifetime {
    /// The latest time the router was told (a routing or a load report):
    /// releases carry no time of their own.
    now_ms: u64,
    mean_stay_ms: Option<f64>,
    mean_step_ms: Option<f64>,
}

impl Lifetime {
    pub fn tick(&mut self, now_ms: u64) {
        self.now_ms = self.now_ms.max(now_ms);
    }

    /// A request routed at `routed_ms` was released.
    pub fn released(&mut self, routed_ms: u64) {
        let stay = self.now_ms.saturating_sub(routed_ms) as f64;
        self.mean_stay_ms = Some(moving_average(self.mean_stay_ms, stay, ALPHA));
    }

    /// A worker reported a decode step of `ms`.
    pub fn step(&mut self, ms: f64) {
        if ms.is_finite() && ms > 0.0 {
            self.mean_step_ms = Some(moving_average(self.mean_step_ms, ms, ALPHA));
        }
    }

    /// Requests arriving per ms, by Little's law, when `in_flight` are
    /// routed and not finished; zero before a stay was measured.
    pub fn arrivals_per_ms(&self, in_flight: u64) -> f64 {
        match self.mean_stay_ms {
            Some(stay) if stay > 0.0 => in_flight as f64 / stay,
            _ => 0.0,
        }
    }

    /// Decode steps over which placing a new request on one worker rather
    /// than another changes how much KV their steps read, with `in_flight`
    /// requests routed and not finished: half a stay (a running stream is
    /// on average halfway through), but no longer than until an arrival
    /// evens the load out again. Arrivals come a stay over `in_flight`
    /// apart (Little's law), and a share `evening` of them goes to a least
    /// busy worker, so one that does comes a stay over `in_flight ·
    /// evening` after this one: the next arrival where every request goes
    /// to the least busy worker; with W workers and placement that ignores
    /// load (`evening` about 1/W), the W-th (docs/routing.md, "The horizon
    /// from the decisions"). Zero until both averages have samples.
    pub fn shared_steps(&self, in_flight: u64, evening: f64) -> f64 {
        match (self.mean_stay_ms, self.mean_step_ms) {
            (Some(stay), Some(step)) => stay / step / (in_flight as f64 * evening).max(2.0),
            _ => 0.0,
        }
    }
}

/// An exponentially weighted mean: the first sample, then each next one
/// with weight `alpha`.
pub(super) fn moving_average(mean: Option<f64>, sample: f64, alpha: f64) -> f64 {
    mean.map_or(sample, |m| m + alpha * (sample - m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_horizon_before_samples() {
        let mut l = Lifetime::default();
        l.tick(1_000);
        l.released(0);
        assert_eq!(l.shared_steps(1, 1.0), 0.0);
        l.step(5.0);
        assert!((l.shared_steps(1, 1.0) - 100.0).abs() < 1e-9);
    }

    #[test]
    fn stays_are_measured_on_the_latest_clock() {
        let mut l = Lifetime::default();
        l.step(10.0);
        for i in 0..200 {
            l.tick(i * 100 + 1_000);
            l.released(i * 100);
        }
        // Every request stayed 1 s: 100 steps of 10 ms, half of them shared
        // while few are in flight, a tenth with 10 in flight (the next
        // arrives after 100 ms); with 30 in flight, 30 arrive a second.
        assert!((l.shared_steps(1, 1.0) - 50.0).abs() < 1e-6);
        assert!((l.shared_steps(10, 1.0) - 10.0).abs() < 1e-6);
        // Where only half the arrivals go to a least busy worker, the one
        // that evens the load out comes twice as late; where none does,
        // the horizon is half a stay.
        assert!((l.shared_steps(10, 0.5) - 20.0).abs() < 1e-6);
        assert!((l.shared_steps(10, 0.0) - 50.0).abs() < 1e-6);
        assert!((l.arrivals_per_ms(30) - 0.03).abs() < 1e-9);
        // A clock that goes back (a late report) does not lengthen stays.
        l.tick(5);
        l.released(20_000);
        assert!(l.shared_steps(1, 1.0) < 50.0);
    }
}
